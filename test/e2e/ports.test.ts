/**
 * Ports on a URL, end to end: real servers inside real sandboxes (no network) on both backends,
 * reached through the server's port proxy over loopback, by path and by Host header, over HTTP
 * and WebSocket; credentials checked with two tenants. The public domain is never resolved: the
 * Host header names it, the connection goes to 127.0.0.1.
 */
import { readFileSync } from 'node:fs';
import { request as httpRequest, type IncomingHttpHeaders } from 'node:http';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { Sandbox, type SandboxSpecInput } from '../../src/sdk/index.js';
import { runCli } from '../helpers/cli.js';
import { expectNoLeaks } from '../helpers/sandbox.js';
import { expectError, startTestServer, waitFor, type TestServer } from './server-helpers.js';

const DOMAIN = 'sandboxes.test';
const SCRIPT = readFileSync(join(import.meta.dirname, '..', 'fixtures', 'port-servers.py'), 'utf8');
const APP_PORT = 8765;
const STATIC_PORT = 8000;
/** The app script's listener that resets every connection it accepts. */
const RESET_PORT = 8766;

let t: TestServer;
let otherKey = '';
const origin = () => new URL(t.url);

beforeAll(async () => {
  t = await startTestServer({ publicDomain: DOMAIN });
  const minted = await t.json<{ apiKey: string }>('POST', '/v1/keys', { body: { tenantId: 'ports-other' } });
  expect(minted.status).toBe(201);
  otherKey = minted.body.apiKey;
});

afterAll(async () => {
  await t?.server.close();
});

afterEach(expectNoLeaks);

interface Answer {
  status: number;
  headers: IncomingHttpHeaders;
  body: string;
}

/** A request to the server on loopback, with any Host header (fetch would not send one). */
function get(path: string, headers: Record<string, string> = {}, method = 'GET', body?: string): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const request = httpRequest({ host: origin().hostname, port: origin().port, path, method, headers }, (response) => {
      const chunks: Buffer[] = [];
      response.on('data', (chunk: Buffer) => chunks.push(chunk));
      response.once('end', () => resolve({ status: response.statusCode ?? 0, headers: response.headers, body: Buffer.concat(chunks).toString('utf8') }));
      response.once('error', reject);
    });
    request.once('error', reject);
    request.end(body);
  });
}

const bearer = (key: string) => ({ authorization: `Bearer ${key}` });
const portPath = (id: string, port: number, rest = '/') => `/v1/sandboxes/${id}/ports/${port}${rest}`;

/** Opens a WebSocket, sends `message`, resolves with the echo. */
function echo(url: string, message: string, headers: Record<string, string>): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = new WebSocket(url, { headers });
    socket.once('open', () => socket.send(message));
    socket.once('message', (data: Buffer) => {
      socket.close();
      resolve(data.toString('utf8'));
    });
    socket.once('unexpected-response', (_request, response) => reject(new Error(`upgrade refused: ${response.statusCode}`)));
    socket.once('error', reject);
  });
}

/** A sandbox running the test's servers; killed in `finally` by the caller. */
async function sandboxWithServers(spec: SandboxSpecInput): Promise<Sandbox> {
  const sandbox = await Sandbox.create({ ...spec, limits: { wallClockMs: 300_000 } }, { url: t.url, apiKey: t.apiKey });
  await sandbox.files.write('/workspace/servers.py', SCRIPT);
  await sandbox.files.write('/workspace/site/hello.txt', 'hello from the sandbox\n');
  return sandbox;
}

async function startServers(sandbox: Sandbox): Promise<void> {
  await sandbox.commands.run(['python3', '/workspace/servers.py', String(APP_PORT), String(RESET_PORT)], { background: true });
  await sandbox.commands.run(['python3', '-m', 'http.server', String(STATIC_PORT), '--bind', '127.0.0.1', '--directory', '/workspace/site'], { background: true });
  for (const port of [APP_PORT, STATIC_PORT]) {
    await waitFor(async () => ((await get(portPath(sandbox.sandboxId, port), bearer(t.apiKey))).status === 200 ? true : undefined), {
      timeoutMs: 60_000,
      what: `port ${port} in sandbox ${sandbox.sandboxId}`,
    });
  }
}

describe.each(['namespace', 'gvisor'] as const)('port URLs on %s', (backend) => {
  it('relays HTTP and WebSocket to servers in a sandbox without a network, for its tenant only', async () => {
    const sandbox = await sandboxWithServers({ backend });
    const id = sandbox.sandboxId;
    try {
      // Nothing listens yet: an answer at once, not a hang.
      const early = await get(portPath(id, STATIC_PORT, '/hello.txt'), bearer(t.apiKey));
      expect(early.status).toBe(502);
      expectError(JSON.parse(early.body), 'PORT_NOT_LISTENING');
      expect((JSON.parse(early.body) as { hint: string }).hint).toContain(`http.server ${STATIC_PORT}`);

      await startServers(sandbox);

      // python3 -m http.server, by path, with the tenant's key.
      const file = await get(portPath(id, STATIC_PORT, '/hello.txt'), bearer(t.apiKey));
      expect(file.status).toBe(200);
      expect(file.body).toBe('hello from the sandbox\n');

      // The app gets neither the tenant's key nor a token; it sees its own path and query.
      const seen = await get(portPath(id, APP_PORT, '/echo?x=1'), { ...bearer(t.apiKey), 'idempotency-key': 'app-owned' });
      const { path, headers } = JSON.parse(seen.body) as { path: string; headers: Record<string, string> };
      expect(path).toBe('/echo?x=1');
      expect(headers.authorization).toBeUndefined();
      expect(headers['idempotency-key']).toBe('app-owned');
      expect(headers['x-forwarded-prefix']).toBe(portPath(id, APP_PORT, ''));

      // A server that resets each connection it accepts: an answer, not a hang (the app's
      // listener is up, so the reset one, started before it, is too). Twice: the first reset
      // leaves nothing behind that would stall the second.
      for (let i = 0; i < 2; i++) {
        const reset = await get(portPath(id, RESET_PORT, '/'), bearer(t.apiKey));
        expect(reset.status).toBe(502);
        expectError(JSON.parse(reset.body), 'PORT_NOT_LISTENING');
        expect((JSON.parse(reset.body) as { hint: string }).hint).toContain('Check the server in the sandbox');
      }

      // Requests in a row reuse one connection inside the sandbox (the proxy keeps it alive).
      const peers = new Set<number>();
      for (let i = 0; i < 3; i++) peers.add((JSON.parse((await get(portPath(id, APP_PORT, '/again'), bearer(t.apiKey))).body) as { peer: number }).peer);
      expect(peers.size).toBe(1);

      // A POST body streams through.
      const posted = await get(portPath(id, APP_PORT, '/upload'), { ...bearer(t.apiKey), 'content-type': 'application/json' }, 'POST', '{"a":1}');
      expect(posted.body).toBe('{"a":1}');

      // Another tenant's key finds no such sandbox; no credential, or a wrong one, is refused.
      expectError(JSON.parse((await get(portPath(id, STATIC_PORT, '/hello.txt'), bearer(otherKey))).body), 'SANDBOX_NOT_FOUND');
      const anonymous = await get(portPath(id, STATIC_PORT, '/hello.txt'));
      expect(anonymous.status).toBe(401);
      expectError(JSON.parse(anonymous.body), 'UNAUTHENTICATED');
      expect((await get(portPath(id, STATIC_PORT, '/hello.txt'), { 'e2b-traffic-access-token': 'ports-other.AAAA' })).status).toBe(401);

      // A signed URL works as it is, and its cookie keeps the page's own links working.
      const signed = await sandbox.portUrl(STATIC_PORT);
      expect(signed.url.startsWith(`${t.url}${portPath(id, STATIC_PORT)}?capsule_token=`)).toBe(true);
      expect(signed.hostUrl).toBe(`http://${STATIC_PORT}-${id}.${DOMAIN}/?capsule_token=${encodeURIComponent(signed.token)}`);
      const opened = await get(new URL(signed.url).pathname.replace(/\/$/, '/hello.txt') + new URL(signed.url).search);
      expect(opened.status).toBe(200);
      const cookie = (opened.headers['set-cookie'] ?? []).find((c) => c.startsWith('capsule_port_token='));
      expect(cookie).toContain(`Path=${portPath(id, STATIC_PORT)}`);
      expect((await get(portPath(id, STATIC_PORT, '/hello.txt'), { cookie: (cookie ?? '').split(';')[0] ?? '' })).status).toBe(200);

      // The token is for that port of that sandbox, unaltered, and unexpired.
      const token = encodeURIComponent(signed.token);
      expect((await get(`${portPath(id, APP_PORT)}?capsule_token=${token}`)).status).toBe(401);
      expect((await get(`${portPath(id, STATIC_PORT)}?capsule_token=${token.slice(0, -2)}xx`)).status).toBe(401);
      const tenantId = signed.token.split('.')[1] ?? '';
      const expired = t.server.app.services.portUrls.sign({ tenantId, sandboxId: id, port: STATIC_PORT }, Date.now() - 1000);
      const late = await get(`${portPath(id, STATIC_PORT)}?capsule_token=${encodeURIComponent(expired)}`);
      expect(late.status).toBe(401);
      expect(JSON.parse(late.body)).toMatchObject({ code: 'UNAUTHENTICATED', message: expect.stringContaining('expired') as unknown });

      // Host routing: P-ID.DOMAIN, as E2B's getHost builds it; with the sandbox's access token.
      const accessToken = t.server.app.services.accessTokens.issue(tenantId, id);
      const byHost = await get('/hello.txt', { host: `${STATIC_PORT}-${id}.${DOMAIN}`, 'e2b-traffic-access-token': accessToken });
      expect(byHost.status).toBe(200);
      expect(byHost.body).toBe('hello from the sandbox\n');

      // WebSocket echo, by path with the key and by host with a signed token.
      const base = `ws://${origin().host}`;
      expect(await echo(`${base}${portPath(id, APP_PORT, '/ws')}`, 'ping over the relay', bearer(t.apiKey))).toBe('ping over the relay');
      const wsSigned = await sandbox.portUrl(APP_PORT, { expiresInMs: 60_000 });
      expect(await echo(`${base}/ws?capsule_token=${encodeURIComponent(wsSigned.token)}`, 'by host', { host: `${APP_PORT}-${id}.${DOMAIN}` })).toBe('by host');
      await expect(echo(`${base}${portPath(id, APP_PORT, '/ws')}`, 'x', bearer(otherKey))).rejects.toThrow('upgrade refused: 404');
      await expect(echo(`${base}${portPath(id, APP_PORT, '/ws')}`, 'x', {})).rejects.toThrow('upgrade refused: 401');

      // The kept-alive connections end with the sandbox, and their pools with them.
      expect(t.server.app.services.portPool.size).toBeGreaterThan(0);
      await sandbox.kill();
      await waitFor(() => Promise.resolve(t.server.app.services.portPool.size === 0 ? true : undefined), { what: 'the port pools of a killed sandbox to close' });
    } finally {
      await sandbox.kill().catch(() => undefined);
    }
  }, 180_000);
});

describe('public ports', () => {
  it('serves a port listed in network.publicPorts without a credential, and no other port', async () => {
    const sandbox = await sandboxWithServers({ network: { publicPorts: [STATIC_PORT] } });
    try {
      await startServers(sandbox);
      const open = await get(portPath(sandbox.sandboxId, STATIC_PORT, '/hello.txt'));
      expect(open.status).toBe(200);
      expect((await get(portPath(sandbox.sandboxId, APP_PORT, '/'))).status).toBe(401);
      expect(sandbox.info.spec.network.publicPorts).toEqual([STATIC_PORT]);
    } finally {
      await sandbox.kill();
    }
  }, 120_000);

  it('refuses a port URL for a sandbox of another tenant; the CLI prints one that works as it is', async () => {
    const sandbox = await Sandbox.create({}, { url: t.url, apiKey: t.apiKey });
    try {
      const cli = await runCli(['sandbox', 'url', sandbox.sandboxId, '9'], { CAPSULE_URL: t.url, CAPSULE_API_KEY: t.apiKey });
      expect(cli.code, cli.stderr).toBe(0);
      const printed = new URL(cli.stdout.trim());
      expect(printed.hostname).toBe(`9-${sandbox.sandboxId}.${DOMAIN}`);
      // Sent by its Host header: past the credential check, to a port where nothing listens.
      const reached = await get(`${printed.pathname}${printed.search}`, { host: printed.host });
      expect(reached.status).toBe(502);
      expectError(JSON.parse(reached.body), 'PORT_NOT_LISTENING');
      const refused = await t.json('POST', `/v1/sandboxes/${sandbox.sandboxId}/port-urls`, { key: otherKey, body: { port: 80 } });
      expect(refused.status).toBe(404);
      expectError(refused.body, 'SANDBOX_NOT_FOUND');
    } finally {
      await sandbox.kill();
    }
  }, 60_000);
});
