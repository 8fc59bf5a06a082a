import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { ApiKeyStore } from '../../src/store/index.js';
import { expectNoLeaks } from '../helpers/sandbox.js';
import { startE2bServer, type E2bTestServer } from './e2b-harness.js';
import { waitFor } from './server-helpers.js';

/**
 * The E2B wire protocol below the SDKs, over raw fetch on loopback: header dispatch, Connect
 * framing (envelopes, end-stream, keepalives), error shapes, and tenant isolation of tokens.
 */
let server: E2bTestServer;

beforeAll(async () => {
  server = await startE2bServer();
});
afterAll(async () => {
  await server?.server.close();
});
afterEach(expectNoLeaks);

interface Created {
  sandboxID: string;
  envdAccessToken: string;
  envdVersion: string;
}

async function create(key = server.e2bKey): Promise<Created> {
  const response = await fetch(`${server.url}/v2/sandboxes`, {
    method: 'POST',
    headers: { 'x-api-key': key, 'content-type': 'application/json' },
    body: JSON.stringify({ templateID: 'base', timeout: 60 }),
  });
  expect(response.status).toBe(201);
  return (await response.json()) as Created;
}

async function kill(id: string, key = server.e2bKey): Promise<number> {
  return (await fetch(`${server.url}/sandboxes/${id}`, { method: 'DELETE', headers: { 'x-api-key': key } })).status;
}

function envd(sbx: Created, extra: Record<string, string> = {}): Record<string, string> {
  return { 'e2b-sandbox-id': sbx.sandboxID, 'e2b-sandbox-port': '49983', 'x-access-token': sbx.envdAccessToken, ...extra };
}

function envelope(message: object): Buffer {
  const json = Buffer.from(JSON.stringify(message));
  const head = Buffer.alloc(5);
  head.writeUInt32BE(json.length, 1);
  return Buffer.concat([head, json]);
}

/** The envelopes of a Connect server-stream response: [flags, message]. */
async function frames(response: Response): Promise<[number, Record<string, unknown>][]> {
  const all = Buffer.from(await response.arrayBuffer());
  const out: [number, Record<string, unknown>][] = [];
  for (let at = 0; at < all.length; ) {
    const length = all.readUInt32BE(at + 1);
    out.push([all[at]!, JSON.parse(all.subarray(at + 5, at + 5 + length).toString()) as Record<string, unknown>]);
    at += 5 + length;
  }
  return out;
}

function start(sbx: Created, script: string, headers: Record<string, string> = {}): Promise<Response> {
  return fetch(`${server.url}/process.Process/Start`, {
    method: 'POST',
    headers: envd(sbx, { 'content-type': 'application/connect+json', 'connect-protocol-version': '1', ...headers }),
    body: envelope({ process: { cmd: '/bin/bash', args: ['-c', script] }, stdin: false }),
  });
}

describe('E2B wire protocol', () => {
  it('dispatches on E2b-Sandbox-Port, not on the path', async () => {
    const sbx = await create();
    try {
      expect(sbx.envdVersion).toBe('0.5.7');
      const envdHealth = await fetch(`${server.url}/health`, { headers: envd(sbx) });
      expect(envdHealth.status).toBe(204);
      const ciHealth = await fetch(`${server.url}/health`, { headers: { ...envd(sbx), 'e2b-sandbox-port': '49999' } });
      expect(await ciHealth.text()).toBe('OK');
      // A port header never reaches Capsule's own routes or the control plane.
      const v1 = await fetch(`${server.url}/v1/sandboxes`, { headers: { ...envd(sbx), authorization: `Bearer ${server.apiKey}` } });
      expect(v1.status).toBe(404);
      // The sandbox is a Capsule sandbox: the v1 API sees it.
      const info = await server.json('GET', `/v1/sandboxes/${sbx.sandboxID}`);
      expect(info.body).toMatchObject({ sandboxId: sbx.sandboxID, state: 'running' });
    } finally {
      expect(await kill(sbx.sandboxID)).toBe(204);
    }
    const gone = await fetch(`${server.url}/health`, { headers: envd(sbx) });
    expect(gone.status).toBe(502);
    expect(await gone.json()).toMatchObject({ code: 502, sandboxId: sbx.sandboxID });
    expect(await kill(sbx.sandboxID)).toBe(404);
  });

  it('streams Connect envelopes: start first, keepalives while idle, end, then the end-stream flag', async () => {
    const sbx = await create();
    try {
      const response = await start(sbx, 'echo out; sleep 1.5; echo err >&2; exit 2', { 'keepalive-ping-interval': '1' });
      expect(response.headers.get('content-type')).toBe('application/connect+json');
      const all = await frames(response);
      expect(all[0]).toEqual([0, { event: { start: { pid: expect.any(Number) as unknown } } }]);
      expect(all).toContainEqual([0, { event: { data: { stdout: Buffer.from('out\n').toString('base64') } } }]);
      expect(all).toContainEqual([0, { event: { data: { stderr: Buffer.from('err\n').toString('base64') } } }]);
      expect(all).toContainEqual([0, { event: { keepalive: {} } }]);
      expect(all.at(-2)).toEqual([0, { event: { end: { exitCode: 2, exited: true, status: 'exit status 2', error: 'exit status 2' } } }]);
      expect(all.at(-1)).toEqual([2, {}]);
      // Audited like the v1 routes: create, then the start with the exit it came to.
      const audit = await server.json<{ records: { operation: string; phase: string; sandboxId: string | null; outcome: string | null }[] }>('GET', '/v1/audit?limit=1000');
      const mine = audit.body.records.filter((r) => r.sandboxId === sbx.sandboxID).map((r) => `${r.operation}/${r.phase}/${r.outcome ?? ''}`);
      expect(mine).toEqual(expect.arrayContaining(['e2b.sandboxes.create/outcome/ok', 'e2b.process.start/attempt/', 'e2b.process.start/outcome/ok']));
    } finally {
      await kill(sbx.sandboxID);
    }
  });

  it('answers unary calls with JSON and errors with Connect codes', async () => {
    const sbx = await create();
    try {
      const call = (method: string, body: object, headers = envd(sbx)) =>
        fetch(`${server.url}/${method}`, { method: 'POST', headers: { ...headers, 'content-type': 'application/json' }, body: JSON.stringify(body) });
      const signal = await call('process.Process/SendSignal', { process: { pid: 999_999 }, signal: 'SIGNAL_SIGKILL' });
      expect(signal.status).toBe(404);
      expect(await signal.json()).toMatchObject({ code: 'not_found' });
      const stat = await call('filesystem.Filesystem/Stat', { path: 'nope' });
      expect(stat.status).toBe(404);
      expect(await stat.json()).toMatchObject({ code: 'not_found', message: expect.stringContaining('/workspace/nope') as unknown });
      const made = await call('filesystem.Filesystem/MakeDir', { path: 'x' });
      expect(await made.json()).toMatchObject({ entry: { path: '/home/user/x', type: 'FILE_TYPE_DIRECTORY', owner: 'user' } });
      const again = await call('filesystem.Filesystem/MakeDir', { path: '/home/user/x' });
      expect([again.status, ((await again.json()) as { code: string }).code]).toEqual([409, 'already_exists']);
      const badToken = await call('process.Process/List', {}, envd(sbx, { 'x-access-token': 'default.forged' }));
      expect([badToken.status, ((await badToken.json()) as { code: string }).code]).toEqual([401, 'unauthenticated']);
      const stream = await start({ ...sbx, envdAccessToken: 'nope' }, 'true');
      expect((await frames(stream)).at(-1)).toEqual([2, { error: { code: 'unauthenticated', message: expect.any(String) as unknown } }]);
    } finally {
      await kill(sbx.sandboxID);
    }
  });

  it('serves the polled watchers of the Python SDK (CreateWatcher / GetWatcherEvents / RemoveWatcher)', async () => {
    const sbx = await create();
    try {
      const call = async (method: string, body: object) => {
        const response = await fetch(`${server.url}/filesystem.Filesystem/${method}`, {
          method: 'POST',
          headers: { ...envd(sbx), 'content-type': 'application/json' },
          body: JSON.stringify(body),
        });
        return { status: response.status, body: (await response.json()) as Record<string, unknown> };
      };
      await call('MakeDir', { path: 'polled' });
      const created = await call('CreateWatcher', { path: '/home/user/polled', recursive: false });
      const watcherId = created.body.watcherId as string;
      expect(watcherId).toMatch(/^w-/);
      await fetch(`${server.url}/files?path=polled/f.txt`, { method: 'POST', headers: { ...envd(sbx), 'content-type': 'application/octet-stream' }, body: 'x' });
      const seen = await waitFor(async () => {
        const polled = await call('GetWatcherEvents', { watcher_id: watcherId });
        const events = polled.body.events as { name: string; type: string }[];
        return events.some((e) => e.name === 'f.txt') ? events : undefined;
      }, { what: 'a polled event for f.txt' });
      expect(seen).toContainEqual({ name: 'f.txt', type: 'EVENT_TYPE_CREATE' });
      expect((await call('RemoveWatcher', { watcherId })).status).toBe(200);
      expect(await call('GetWatcherEvents', { watcherId })).toMatchObject({ status: 404, body: { code: 'not_found' } });
    } finally {
      await kill(sbx.sandboxID);
    }
  });

  it('keeps tenants apart: keys, sandboxes and access tokens', async () => {
    const other = new ApiKeyStore(server.server.db).mint('other-tenant');
    const otherKey = `e2b_${other.apiKey.slice(4)}`;
    const mine = await create();
    const theirs = await create(otherKey);
    try {
      const info = await fetch(`${server.url}/sandboxes/${mine.sandboxID}`, { headers: { 'x-api-key': otherKey } });
      expect([info.status, await info.json()]).toEqual([404, { code: 404, message: expect.stringContaining('not found') as unknown }]);
      expect(await kill(mine.sandboxID, otherKey)).toBe(404);
      // My token does not open their sandbox.
      const health = await fetch(`${server.url}/health`, { headers: envd({ ...theirs, envdAccessToken: mine.envdAccessToken }) });
      expect(health.status).toBe(502);
      // Without an E2B key the caller is not an E2B client: Capsule's error shape.
      const noKey = await fetch(`${server.url}/v2/sandboxes`, { method: 'GET' });
      expect([noKey.status, await noKey.json()]).toEqual([401, expect.objectContaining({ code: 'UNAUTHENTICATED', requestId: expect.any(String) as unknown }) as unknown]);
      const capKey = await fetch(`${server.url}/v2/sandboxes`, { headers: { 'x-api-key': server.apiKey } });
      expect(capKey.status).toBe(401);
      const unsigned = await fetch(`${server.url}/files?path=a.txt`);
      expect([unsigned.status, ((await unsigned.json()) as { code: string }).code]).toEqual([404, 'NOT_FOUND']);
    } finally {
      expect(await kill(mine.sandboxID)).toBe(204);
      expect(await kill(theirs.sandboxID, otherKey)).toBe(204);
    }
  });
});
