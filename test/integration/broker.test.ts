import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { createServer, type Server } from 'node:http';
import { connect, type AddressInfo } from 'node:net';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { brotliCompressSync, deflateRawSync, deflateSync, gzipSync } from 'node:zlib';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';
import { EgressProxy } from '../../src/host/egress/egress-proxy.js';
import { CredentialBroker, OPERATOR_TENANT, type BrokerHandle, type BrokerLogEntry } from '../../src/host/egress/broker.js';
import { DEFAULT_TENANT } from '../../src/store/api-keys.js';
import { parseSpec } from '../../src/sandbox-spec/index.js';

/*
 * The credential broker behind the real egress proxy, on 127.0.0.1 with free ports; this test
 * process plays the sandbox (its source address 127.0.0.1 is registered) and sends raw requests,
 * so the exact request target reaches the proxy. The upstream is a server on loopback that can
 * misbehave: it echoes the credential back compressed although asked for identity.
 */
const SECRET = 'capsule-broker-secret-51d0c2a9e4';
const upstreamSaw: string[] = [];
const log: BrokerLogEntry[] = [];
let dir: string;
let broker: CredentialBroker;
let proxy: EgressProxy;
let upstream: Server;
let bomb: Buffer;

function sendEncoded(res: import('node:http').ServerResponse, encoding: string, body: Buffer): void {
  res.writeHead(200, { 'content-type': 'text/plain', 'content-encoding': encoding, 'content-length': body.length });
  res.end(body);
}

beforeAll(async () => {
  dir = await mkdtemp(join(testDataDir(), 'broker-'));
  broker = new CredentialBroker({ dir, log: (e) => log.push(e) });
  bomb = gzipSync(Buffer.alloc(64 * 1024 * 1024, 'a')); // 64 KiB on the wire
  upstream = createServer((req, res) => {
    upstreamSaw.push(req.url ?? '');
    const url = req.url ?? '';
    const echo = Buffer.from(`you sent ${req.headers.authorization ?? 'nothing'}\n`);
    if (url.endsWith('/gzip')) return sendEncoded(res, 'gzip', gzipSync(echo));
    if (url.endsWith('/deflate')) return sendEncoded(res, 'deflate', deflateSync(echo));
    if (url.endsWith('/deflate-raw')) return sendEncoded(res, 'deflate', deflateRawSync(echo));
    if (url.endsWith('/br')) return sendEncoded(res, 'br', brotliCompressSync(echo));
    if (url.endsWith('/layered')) return sendEncoded(res, 'gzip, br', brotliCompressSync(gzipSync(echo)));
    if (url.endsWith('/compress')) return sendEncoded(res, 'compress', echo);
    if (url.endsWith('/broken')) return sendEncoded(res, 'gzip', Buffer.from('not gzip at all, but it holds ' + SECRET));
    if (url.endsWith('/bomb')) return sendEncoded(res, 'gzip', bomb);
    res.end(`${req.method} ${url}`);
  });
  await new Promise<void>((resolve) => upstream.listen(0, '127.0.0.1', resolve));
  const base = `http://127.0.0.1:${(upstream.address() as AddressInfo).port}/v1`;
  await broker.setSecret('token', SECRET);
  const handle: Omit<BrokerHandle, 'name'> = {
    upstream: base, secret: 'token', headers: { Authorization: 'Bearer {{secret}}' }, maxResponseBytes: 4096, methods: ['GET'], pathPrefixes: ['/public', '/echo'],
  };
  await broker.registerHandle({ ...handle, name: 'api' });
  await broker.registerHandle({ ...handle, name: 'acme.api', tenants: ['acme'] });
  proxy = new EgressProxy({ address: '127.0.0.1', ports: { proxy: 0, http: 0, tls: 0, dns: 0 }, broker, log: () => undefined });
  await proxy.start();
});

afterAll(async () => {
  await proxy?.close();
  await new Promise((resolve) => upstream?.close(resolve));
  if (dir) await rm(dir, { recursive: true, force: true });
});
afterEach(async () => {
  proxy.unregister('brokertest');
  upstreamSaw.length = 0;
  await expectNoLeaks();
});

/** The sandbox 127.0.0.1 of `tenantId` (undefined: a one-shot run of the operator) naming `handles`. */
function as(tenantId: string | undefined, handles: string[]): void {
  proxy.unregister('brokertest');
  proxy.register('brokertest', '127.0.0.1', parseSpec({ network: { mode: 'allowlist', handles } }).network, tenantId);
}

interface Answer {
  status: number;
  headers: Record<string, string>;
  body: string;
}

/**
 * Sends `GET target` as raw bytes: to the proxy port as an absolute URI (proxy-aware clients),
 * or to the redirected-HTTP port with a Host header (Node fetch).
 */
function get(target: string, via: 'proxy' | 'redirected' = 'proxy'): Promise<Answer> {
  const port = via === 'proxy' ? proxy.ports.proxy : proxy.ports.http;
  const line = via === 'proxy' ? `http://broker.capsule${target}` : target;
  return new Promise((resolve, reject) => {
    const socket = connect(port, '127.0.0.1', () => socket.write(`GET ${line} HTTP/1.1\r\nHost: broker.capsule\r\nConnection: close\r\n\r\n`));
    const chunks: Buffer[] = [];
    socket.on('data', (chunk: Buffer) => chunks.push(chunk));
    socket.once('error', reject);
    socket.once('end', () => {
      const text = Buffer.concat(chunks).toString('latin1');
      const [head = '', ...rest] = text.split('\r\n\r\n');
      const [status = '', ...lines] = head.split('\r\n');
      const headers = Object.fromEntries(lines.map((l) => [l.slice(0, l.indexOf(':')).toLowerCase(), l.slice(l.indexOf(':') + 1).trim()]));
      resolve({ status: Number(status.split(' ')[1]), headers, body: rest.join('\r\n\r\n') });
    });
  });
}

const code = (answer: Answer): string => (JSON.parse(answer.body) as { code: string }).code;

describe('broker paths are checked decoded and normalised (finding 7)', () => {
  it.each([
    ['/api/public/..%2fadmin', 'encoded slash'],
    ['/api/public/..%2Fadmin', 'encoded slash'],
    ['/api/public/%2e%2e/admin', 'dot segment'],
    ['/api/public/.%2E/admin', 'dot segment'],
    ['/api/public/../admin', 'dot segment'],
    ['/api/public/./x', 'dot segment'],
    ['/api/public/..%5cadmin', 'backslash'],
    ['/api/public/..\\admin', 'backslash'],
    ['/api/public//admin', 'empty path segment'],
    ['/api/public/%zz', 'malformed percent escape'],
    ['/api/public/a%00b', 'control character'],
  ])('%s is refused (400 BROKER_BAD_PATH, %s) and nothing goes upstream', async (target, why) => {
    as(DEFAULT_TENANT, ['api']);
    for (const via of ['proxy', 'redirected'] as const) {
      const answer = await get(target, via);
      expect(answer.status, `${via}: ${answer.body}`).toBe(400);
      expect(code(answer)).toBe('BROKER_BAD_PATH');
      expect(answer.body).toContain(why);
    }
    expect(upstreamSaw).toEqual([]);
    expect(log.at(-1)).toMatchObject({ sandboxId: 'brokertest', status: 400, code: 'BROKER_BAD_PATH' });
  });

  it('checks the prefix on the normalised path and forwards exactly that path', async () => {
    as(DEFAULT_TENANT, ['api']);
    // %70 is "p": /%70ublic is /public; an encoded ";" stays encoded (it is data, not a delimiter).
    const ok = await get('/api/%70ublic/a%7Eb/c%3bd/?q=1%2F2');
    expect(ok.status, ok.body).toBe(200);
    expect(ok.body).toBe('GET /v1/public/a~b/c%3Bd/?q=1%2F2');
    expect(upstreamSaw).toEqual(['/v1/public/a~b/c%3Bd/?q=1%2F2']);
    // A name that only looks like the prefix once decoded the wrong way is outside it.
    const outside = await get('/api/publicx/a');
    expect(code(outside)).toBe('BROKER_PATH_NOT_ALLOWED');
    expect(upstreamSaw).toHaveLength(1);
  });
});

describe('redaction sees decoded bodies (finding 8)', () => {
  it.each(['gzip', 'deflate', 'deflate-raw', 'br', 'layered'])('an upstream that answers %s with the secret gets it redacted', async (kind) => {
    as(DEFAULT_TENANT, ['api']);
    const answer = await get(`/api/echo/${kind}`);
    expect(answer.status, answer.body).toBe(200);
    expect(answer.body).toBe('you sent [REDACTED]\n'); // the whole injected header value
    expect(answer.headers['content-encoding']).toBeUndefined();
    expect(answer.body).not.toContain(SECRET);
  });

  it('refuses a body in a coding it cannot decode, or that does not decode, never passing it on', async () => {
    as(DEFAULT_TENANT, ['api']);
    for (const kind of ['compress', 'broken']) {
      const answer = await get(`/api/echo/${kind}`);
      expect(answer.status, answer.body).toBe(502);
      expect(code(answer)).toBe('BROKER_UPSTREAM_FAILED');
      expect(answer.body).not.toContain(SECRET);
    }
  });

  it('bounds what it decodes: a 64 MiB gzip bomb comes back cut at the cap and flagged', async () => {
    as(DEFAULT_TENANT, ['api']);
    const answer = await get('/api/echo/bomb');
    expect(answer.status).toBe(200);
    expect(answer.body).toBe('a'.repeat(4096));
    expect(answer.headers['x-capsule-truncated']).toBe('true');
  });
});

describe('handles are tenant grants (finding 6)', () => {
  it('serves a handle only to tenants it is granted to; no grant means the operator only', async () => {
    expect(OPERATOR_TENANT).toBe(DEFAULT_TENANT);
    as('acme', ['acme.api', 'api']);
    expect((await get('/acme.api/public/a')).status).toBe(200);
    expect(code(await get('/api/public/a'))).toBe('BROKER_UNKNOWN_HANDLE');
    as('globex', ['acme.api']);
    expect(code(await get('/acme.api/public/a'))).toBe('BROKER_UNKNOWN_HANDLE');
    as(undefined, ['api']);
    expect((await get('/api/public/a')).status).toBe(200);
    expect(upstreamSaw).toEqual(['/v1/public/a', '/v1/public/a']);
    expect(await broker.ungranted('acme', ['acme.api', 'api', 'nope'])).toEqual(['api', 'nope']);
    expect(await broker.ungranted(DEFAULT_TENANT, ['acme.api', 'api'])).toEqual(['acme.api']);
  });

  it('applies a revoked grant to the next request of a running sandbox', async () => {
    as('acme', ['acme.api']);
    expect((await get('/acme.api/public/a')).status).toBe(200);
    const [handle] = (await broker.listHandles()).filter((h) => h.name === 'acme.api');
    // As an operator edits it: a second broker (another process) rewrites handles.json.
    const operator = new CredentialBroker({ dir });
    await operator.registerHandle({ ...handle!, tenants: ['globex'] });
    try {
      expect(code(await get('/acme.api/public/a'))).toBe('BROKER_UNKNOWN_HANDLE');
    } finally {
      await operator.registerHandle({ ...handle!, tenants: ['acme'] });
    }
  });

  it('refuses a grant naming something that is not a tenant id', async () => {
    const [handle] = await broker.listHandles();
    await expect(broker.registerHandle({ ...handle!, name: 'bad', tenants: ['Not A Tenant'] })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
  });
});

describe('the broker configuration', () => {
  it('refuses to guess from a handles.json that does not parse, and reads it again once fixed', async () => {
    const file = join(dir, 'handles.json');
    const good = await readFile(file, 'utf8');
    await writeFile(file, '[{"name": "api", ', { mode: 0o600 }); // an operator mid-edit
    try {
      await expect(broker.ungranted(DEFAULT_TENANT, ['api'])).rejects.toMatchObject({ code: 'HOST_NOT_READY' });
    } finally {
      await writeFile(file, good, { mode: 0o600 });
    }
    expect(await broker.ungranted(DEFAULT_TENANT, ['api'])).toEqual([]);
  });
});
