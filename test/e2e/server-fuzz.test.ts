import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { expectNoLeaks } from '../helpers/sandbox.js';
import { startTestServer, type TestServer } from './server-helpers.js';

/**
 * Property: whatever a client sends (methods, paths, headers, bodies), the server answers with
 * a status below 500 or a deliberate 5xx other than 500, and every error has the wire shape.
 * Requests go through Fastify's whole pipeline (parsers, hooks, the seam) with inject().
 */
let t: TestServer;
let liveId: string;
beforeAll(async () => {
  t = await startTestServer({ maxSandboxesPerTenant: 2 });
  const created = await t.json<{ sandboxId: string }>('POST', '/v1/sandboxes', { body: { spec: { limits: { wallClockMs: 1000 }, ttlMs: 60_000 } } });
  liveId = created.body.sandboxId;
});
afterAll(async () => {
  await t.server.close();
  await expectNoLeaks();
});

const segment = fc.oneof(
  fc.constantFrom('v1', 'sandboxes', 'processes', 'files', 'list', 'stat', 'mkdir', 'move', 'stdin', 'close', 'signal', 'events', 'keys', 'audit', 'operations', 'timeout', 'keepalive', '..', '%00', '%zz', ''),
  fc.string({ maxLength: 30 }).map(encodeURIComponent),
  fc.stringMatching(/^[a-z2-7]{20}$/),
);

const templates = [
  '/v1/sandboxes',
  '/v1/sandboxes/{id}',
  '/v1/sandboxes/{id}/timeout',
  '/v1/sandboxes/{id}/keepalive',
  '/v1/sandboxes/{id}/processes',
  '/v1/sandboxes/{id}/processes/{pid}/events',
  '/v1/sandboxes/{id}/processes/{pid}/stdin',
  '/v1/sandboxes/{id}/processes/{pid}/stdin/close',
  '/v1/sandboxes/{id}/processes/{pid}/signal',
  '/v1/sandboxes/{id}/files',
  '/v1/sandboxes/{id}/files/list',
  '/v1/sandboxes/{id}/files/stat',
  '/v1/sandboxes/{id}/files/mkdir',
  '/v1/sandboxes/{id}/files/move',
  '/v1/sandboxes/{id}/files/watch',
  '/v1/keys',
  '/v1/audit',
  '/v1/operations/{key}',
  '/healthz',
  '/openapi.json',
];

const query = fc.array(
  fc.tuple(
    fc.constantFrom('path', 'state', 'metadata', 'limit', 'cursor', 'depth', 'recursive', 'after', 'x'),
    fc.oneof(fc.constantFrom('running', 'a=b', '10', '0', '-1', 'true', '/workspace', 'a/../../b', '', '%00'), fc.string({ maxLength: 20 })),
  ),
  { maxLength: 4 },
);

const path = fc
  .record({
    template: fc.constantFrom(...templates),
    useLive: fc.boolean(),
    id: segment,
    pid: fc.oneof(fc.constantFrom('1', '2', '3', '0', '-1', '99999999999', 'abc'), segment),
    key: segment,
    query,
    free: fc.array(segment, { maxLength: 6 }),
    freeForm: fc.boolean(),
  })
  .map((p) => {
    const base = p.freeForm
      ? `/${p.free.join('/')}`
      : p.template
          // A live sandbox's watch stream never ends by itself: fuzz it with ids that do not exist.
          .replace('{id}', p.useLive && !p.template.endsWith('/watch') ? liveId : p.id)
          .replace('{pid}', p.pid)
          .replace('{key}', p.key);
    const qs = p.query.map(([k, v]) => `${k}=${encodeURIComponent(v)}`).join('&');
    return qs ? `${base}?${qs}` : base;
  });

const jsonValue = fc.oneof(
  fc.json({ maxDepth: 3 }),
  fc.constantFrom('{}', 'null', '[]', '{"spec":{}}', '{"argv":["true"]}', '{"argv":["/nope"],"background":true}', '{"ttlMs":1}', '{"signal":"SIGTERM"}', '{"path":"x"}', '{"source":"a","destination":"b"}', '{"tenantId":"fuzz"}', '{"__proto__":{"a":1}}', '{"spec":'),
  fc.record({ argv: fc.array(fc.string({ maxLength: 8 }), { maxLength: 3 }), timeoutMs: fc.integer({ min: -5, max: 800 }), stdin: fc.boolean() }, { requiredKeys: [] }).map((v) => JSON.stringify(v)),
  fc.record({ spec: fc.object({ maxDepth: 2 }), metadata: fc.dictionary(fc.string({ maxLength: 5 }), fc.string({ maxLength: 5 })) }, { requiredKeys: [] }).map((v) => JSON.stringify(v)),
);

const request = fc.record({
  method: fc.constantFrom('GET', 'POST', 'PUT', 'DELETE', 'PATCH', 'HEAD', 'OPTIONS'),
  path,
  body: fc.option(fc.oneof(jsonValue, fc.string({ maxLength: 50 })), { nil: undefined }),
  contentType: fc.option(fc.constantFrom('application/json', 'application/octet-stream', 'text/plain', 'application/x-www-form-urlencoded', 'multipart/form-data', 'garbage', 'application/json; charset=latin1'), { nil: undefined }),
  auth: fc.constantFrom('bearer', 'x-api-key', 'none', 'bad', 'malformed'),
  idempotencyKey: fc.option(fc.oneof(fc.string({ maxLength: 10 }), fc.constantFrom('', ' ', 'k'.repeat(300))), { nil: undefined }),
});

describe('the server under random input', () => {
  it('never answers 500 and always sends the error shape', async () => {
    await fc.assert(
      fc.asyncProperty(request, async (r) => {
        const headers: Record<string, string> = {};
        if (r.contentType !== undefined) headers['content-type'] = r.contentType;
        if (r.auth === 'bearer') headers.authorization = `Bearer ${t.apiKey}`;
        if (r.auth === 'x-api-key') headers['x-api-key'] = t.apiKey;
        if (r.auth === 'bad') headers.authorization = `Bearer cap_${'1'.repeat(40)}`;
        if (r.auth === 'malformed') headers.authorization = 'Basic Zm9vOmJhcg==';
        if (r.idempotencyKey !== undefined) headers['idempotency-key'] = r.idempotencyKey;
        const hasBody = r.body !== undefined && r.method !== 'GET' && r.method !== 'HEAD';
        const response = await Promise.race([
          t.server.app.app.inject({ method: r.method as 'GET', url: r.path, headers, ...(hasBody ? { payload: r.body } : {}) }),
          new Promise<never>((_, reject) => setTimeout(() => reject(new Error(`no answer in 5 s: ${JSON.stringify(r)}`)), 5000).unref()),
        ]);
        const label = `${r.method} ${r.path} -> ${response.statusCode} ${response.body.slice(0, 300)}`;
        expect(response.statusCode, label).not.toBe(500);
        if (response.statusCode >= 400 && r.method !== 'HEAD') {
          const body = JSON.parse(response.body) as Record<string, unknown>;
          expect(typeof body.code, label).toBe('string');
          expect(typeof body.message, label).toBe('string');
          expect(body.requestId, label).toMatch(/^req_/);
        }
      }),
      { numRuns: 300, interruptAfterTimeLimit: 45_000 },
    );
  });
});
