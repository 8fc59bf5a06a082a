import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { FeedEventWire, SandboxInfo, Session } from '../../src/wire/index.js';
import { expectNoLeaks } from '../helpers/sandbox.js';
import { expectError, readNdjson, startTestServer, type TestServer } from './server-helpers.js';

/**
 * Issue 17: the API the web console uses, which any client may call: sessions from a one-time
 * login token or a key, the operator's cross-tenant views, the live feed (per tenant), audit
 * verification, metrics history and PTY resize. Two real tenants, real sandboxes.
 */
let t: TestServer;
let aliceKey: string;
let bobKey: string;
let aliceBox: SandboxInfo;
let bobBox: SandboxInfo;

async function mint(tenantId: string): Promise<string> {
  const minted = await t.json<{ apiKey: string }>('POST', '/v1/keys', { body: { tenantId } });
  expect(minted.status, JSON.stringify(minted.body)).toBe(201);
  return minted.body.apiKey;
}

async function create(key: string, metadata: Record<string, string>): Promise<SandboxInfo> {
  const created = await t.json<SandboxInfo>('POST', '/v1/sandboxes', { key, body: { spec: { ttlMs: 300_000 }, metadata } });
  expect(created.status, JSON.stringify(created.body)).toBe(201);
  return created.body;
}

/** Reads NDJSON events from a live stream until `done` says stop; every event read is returned. */
async function readUntil(response: Response, done: (event: FeedEventWire) => boolean): Promise<FeedEventWire[]> {
  const reader: ReadableStreamDefaultReader<Uint8Array> = response.body!.getReader();
  const decoder = new TextDecoder();
  const events: FeedEventWire[] = [];
  let pending = '';
  try {
    for (;;) {
      const { value, done: ended } = await reader.read();
      if (ended) throw new Error(`the stream ended before the awaited event: ${JSON.stringify(events)}`);
      pending += decoder.decode(value, { stream: true });
      let newline: number;
      while ((newline = pending.indexOf('\n')) >= 0) {
        const line = pending.slice(0, newline);
        pending = pending.slice(newline + 1);
        if (line === '') continue;
        const event = JSON.parse(line) as FeedEventWire;
        events.push(event);
        if (done(event)) return events;
      }
    }
  } finally {
    await reader.cancel();
  }
}

function sandboxIds(events: FeedEventWire[]): string[] {
  return events.flatMap((e) => (e.type === 'snapshot' ? e.sandboxes.map((s) => s.sandboxId) : e.type === 'sandbox' ? [e.sandbox.sandboxId] : e.type === 'usage' ? [e.sandboxId] : []));
}

beforeAll(async () => {
  t = await startTestServer();
  aliceKey = await mint('alice');
  bobKey = await mint('bob');
  aliceBox = await create(aliceKey, { owner: 'alice' });
  bobBox = await create(bobKey, { owner: 'bob' });
}, 120_000);

afterAll(async () => {
  if (t) {
    for (const [box, key] of [
      [aliceBox, aliceKey],
      [bobBox, bobKey],
    ] as const) {
      if (box) await t.call('DELETE', `/v1/sandboxes/${box.sandboxId}`, { key });
    }
    await t.server.close();
  }
  await expectNoLeaks();
}, 120_000);

describe('console sessions', () => {
  it('redeems the Console URL’s login token once, for a session acting as the operator', async () => {
    const url = t.server.newConsoleUrl();
    const token = /#login=([A-Za-z0-9_]+)$/.exec(url ?? '')?.[1];
    expect(token, url).toBeDefined();
    expect(url).not.toContain(t.apiKey);
    const login = await t.json<Session>('POST', '/v1/sessions/login', { key: null, body: { loginToken: token } });
    expect(login.status, JSON.stringify(login.body)).toBe(201);
    expect(login.body).toMatchObject({ tenantId: 'default', admin: true });
    expect(login.body.sessionKey).not.toBe(t.apiKey);
    const again = await t.json('POST', '/v1/sessions/login', { key: null, body: { loginToken: token } });
    expect(again.status).toBe(401);
    expectError(again.body, 'UNAUTHENTICATED');
    // The session key is a working operator key until it is ended.
    const listed = await t.json<{ sandboxes: SandboxInfo[] }>('GET', '/v1/admin/sandboxes', { key: login.body.sessionKey });
    expect(listed.status).toBe(200);
    const who = await t.json<{ admin: boolean; sessionExpiresAt: string | null }>('GET', '/v1/whoami', { key: login.body.sessionKey });
    expect(who.body).toMatchObject({ admin: true, sessionExpiresAt: login.body.expiresAt });
    expect((await t.call('DELETE', '/v1/sessions/current', { key: login.body.sessionKey })).status).toBe(204);
    const after = await t.json('GET', '/v1/whoami', { key: login.body.sessionKey });
    expect(after.status).toBe(401);
  });

  it('makes a tenant session from a tenant key, with the tenant’s rights only', async () => {
    const session = await t.json<Session>('POST', '/v1/sessions', { key: aliceKey });
    expect(session.status).toBe(201);
    expect(session.body).toMatchObject({ tenantId: 'alice', admin: false });
    const admin = await t.json('GET', '/v1/admin/sandboxes', { key: session.body.sessionKey });
    expect(admin.status).toBe(403);
    expectError(admin.body, 'PERMISSION_DENIED');
    const mine = await t.json<{ sandboxes: SandboxInfo[] }>('GET', '/v1/sandboxes', { key: session.body.sessionKey });
    expect(mine.body.sandboxes.map((s) => s.sandboxId)).toEqual([aliceBox.sandboxId]);
    // An API key is not a session: it cannot be ended this way.
    const end = await t.json('DELETE', '/v1/sessions/current', { key: aliceKey });
    expect(end.status).toBe(400);
    expectError(end.body, 'INVALID_ARGUMENT');
  });
});

describe('the operator’s cross-tenant views', () => {
  it('lists every tenant’s sandboxes, or one tenant’s; a tenant key may not', async () => {
    const all = await t.json<{ sandboxes: SandboxInfo[] }>('GET', '/v1/admin/sandboxes');
    expect(all.body.sandboxes.map((s) => s.sandboxId).sort()).toEqual([aliceBox.sandboxId, bobBox.sandboxId].sort());
    const bobs = await t.json<{ sandboxes: SandboxInfo[] }>('GET', '/v1/admin/sandboxes?tenant=bob');
    expect(bobs.body.sandboxes.map((s) => s.sandboxId)).toEqual([bobBox.sandboxId]);
    const refused = await t.json('GET', '/v1/admin/sandboxes', { key: bobKey });
    expect(refused.status).toBe(403);
    expectError(refused.body, 'PERMISSION_DENIED');
  });

  it('acts in a tenant with X-Capsule-Tenant; a tenant key sending it is refused', async () => {
    const asAlice = await t.json<SandboxInfo>('GET', `/v1/sandboxes/${aliceBox.sandboxId}`, { headers: { 'x-capsule-tenant': 'alice' } });
    expect(asAlice.status).toBe(200);
    const withoutHeader = await t.json('GET', `/v1/sandboxes/${aliceBox.sandboxId}`);
    expect(withoutHeader.status).toBe(404);
    const bobPosing = await t.json('GET', `/v1/sandboxes/${aliceBox.sandboxId}`, { key: bobKey, headers: { 'x-capsule-tenant': 'alice' } });
    expect(bobPosing.status).toBe(403);
    expectError(bobPosing.body, 'PERMISSION_DENIED');
  });

  it('verifies the audit chain (admin only) and lists one sandbox’s records to its tenant only', async () => {
    const verify = await t.json<{ ok: boolean; records: number }>('GET', '/v1/audit/verify');
    expect(verify.body).toMatchObject({ ok: true });
    expect(verify.body.records).toBeGreaterThan(0);
    expect((await t.json('GET', '/v1/audit/verify', { key: aliceKey })).status).toBe(403);
    const records = await t.json<{ records: { sandboxId: string | null; operation: string }[] }>('GET', `/v1/sandboxes/${aliceBox.sandboxId}/audit`, { key: aliceKey });
    expect(records.status).toBe(200);
    expect(records.body.records.map((r) => r.operation)).toContain('sandboxes.create');
    expect(new Set(records.body.records.map((r) => r.sandboxId))).toEqual(new Set([aliceBox.sandboxId]));
    const foreign = await t.json('GET', `/v1/sandboxes/${aliceBox.sandboxId}/audit`, { key: bobKey });
    expect(foreign.status).toBe(404);
  });

  it('gives the metrics history and host capacity to the operator only', async () => {
    const history = await t.json<{ samples: { creates: { count: number }[] }[]; capacity: { cpus: number; sandboxes: { live: number } } }>('GET', '/v1/admin/metrics');
    expect(history.status).toBe(200);
    expect(history.body.samples.length).toBeGreaterThan(0);
    expect(history.body.samples.at(-1)!.creates.reduce((n, c) => n + c.count, 0)).toBeGreaterThanOrEqual(2);
    expect(history.body.capacity.cpus).toBeGreaterThan(0);
    expect(history.body.capacity.sandboxes.live).toBe(2);
    expect((await t.json('GET', '/v1/admin/metrics', { key: aliceKey })).status).toBe(403);
  });
});

describe('the feed of sandbox changes', () => {
  it('sends a tenant its own sandboxes and their changes, never another tenant’s', async () => {
    const response = await t.call('GET', '/v1/sandboxes/events', { key: aliceKey });
    expect(response.status).toBe(200);
    const snapshot = await readUntil(response, (e) => e.type === 'snapshot');
    expect(sandboxIds(snapshot)).toEqual([aliceBox.sandboxId]);
    // Changes in order: bob's new sandbox first, then alice's; alice's stream has only hers.
    const live = await t.call('GET', '/v1/sandboxes/events', { key: aliceKey });
    const bobsOther = await create(bobKey, { owner: 'bob', n: '2' });
    const alicesOther = await create(aliceKey, { owner: 'alice', n: '2' });
    try {
      const events = await readUntil(live, (e) => e.type === 'sandbox' && e.sandbox.sandboxId === alicesOther.sandboxId && e.sandbox.state === 'running');
      expect(sandboxIds(events)).not.toContain(bobsOther.sandboxId);
      expect(sandboxIds(events)).not.toContain(bobBox.sandboxId);
      // The operator's feed has both tenants.
      const operator = await t.call('GET', '/v1/admin/sandboxes/events');
      const all = await readUntil(operator, (e) => e.type === 'snapshot');
      expect(sandboxIds(all)).toEqual(expect.arrayContaining([aliceBox.sandboxId, bobBox.sandboxId, bobsOther.sandboxId, alicesOther.sandboxId]));
    } finally {
      await t.call('DELETE', `/v1/sandboxes/${bobsOther.sandboxId}`, { key: bobKey });
      await t.call('DELETE', `/v1/sandboxes/${alicesOther.sandboxId}`, { key: aliceKey });
    }
  });
});

describe('PTY resize', () => {
  it('changes the terminal size the process sees', async () => {
    const base = `/v1/sandboxes/${aliceBox.sandboxId}/processes`;
    const started = await t.json<{ pid: number }>('POST', base, { key: aliceKey, body: { argv: ['sh', '-c', 'read line; stty size'], pty: { cols: 80, rows: 24 }, stdin: true, background: true } });
    expect(started.status, JSON.stringify(started.body)).toBe(201);
    const pid = started.body.pid;
    expect((await t.call('POST', `${base}/${pid}/resize`, { key: aliceKey, body: { cols: 101, rows: 33 } })).status).toBe(204);
    expect((await t.call('POST', `${base}/${pid}/stdin`, { key: aliceKey, raw: '\n' })).status).toBeLessThan(300);
    const events = await readNdjson(await t.call('GET', `${base}/${pid}/events`, { key: aliceKey }));
    const stdout = events
      .filter((e) => e.type === 'stdout')
      .map((e) => Buffer.from(String(e.data), 'base64').toString())
      .join('');
    expect(stdout).toContain('33 101');
    const foreign = await t.json('POST', `${base}/${pid}/resize`, { key: bobKey, body: { cols: 90, rows: 30 } });
    expect(foreign.status).toBe(404);
  });
});

describe('the console’s static files', () => {
  it('serves the built console under /ui/ with a strict CSP, and nothing outside its folder', async () => {
    const page = await t.call('GET', '/ui/', { key: null });
    expect(page.status).toBe(200);
    expect(page.headers.get('content-type')).toMatch(/^text\/html/);
    expect(page.headers.get('content-security-policy')).toContain("script-src 'self'");
    expect(page.headers.get('content-security-policy')).toContain("connect-src 'self'");
    expect(await page.text()).toContain('/ui/assets/');
    // Encoded slashes keep the dots in one segment, so the URL is not normalised before the server.
    for (const path of ['/ui/..%2f..%2fpackage.json', '/ui/assets/%2e%2e%2f%2e%2e%2f%2e%2e%2fpackage.json', '/ui/%2fetc%2fpasswd']) {
      const response = await t.call('GET', path, { key: null });
      const text = await response.text();
      expect(response.status, path).toBe(404);
      expect(text, path).not.toContain('"devDependencies"');
      expect(text, path).not.toContain('root:');
    }
  });
});
