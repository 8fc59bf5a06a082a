/**
 * E2B's `sandbox.getHost(port)` against Capsule's port proxy, with the real E2B SDK: the facade
 * reports the server's public domain, the SDK builds `P-ID.DOMAIN`, and the request (sent to
 * 127.0.0.1 with that Host header; the domain is never resolved) carries the sandbox's traffic
 * access token.
 */
import { request as httpRequest } from 'node:http';
import { Sandbox } from 'e2b';
import { afterAll, afterEach, beforeAll, expect, it } from 'vitest';
import { expectNoLeaks } from '../helpers/sandbox.js';
import { startTestServer, waitFor, type TestServer } from './server-helpers.js';

const DOMAIN = 'capsule.invalid';
let t: TestServer;
let opts: { apiKey: string; apiUrl: string; sandboxUrl: string; domain: string; requestTimeoutMs: number };

beforeAll(async () => {
  t = await startTestServer({ publicDomain: DOMAIN });
  opts = { apiKey: `e2b_${t.apiKey.slice('cap_'.length)}`, apiUrl: t.url, sandboxUrl: t.url, domain: DOMAIN, requestTimeoutMs: 30_000 };
});

afterAll(async () => {
  await t?.server.close();
});

afterEach(expectNoLeaks);

function getByHost(host: string, path: string, headers: Record<string, string>): Promise<{ status: number; body: string }> {
  const origin = new URL(t.url);
  return new Promise((resolve, reject) => {
    const request = httpRequest({ host: origin.hostname, port: origin.port, path, headers: { ...headers, host } }, (response) => {
      const chunks: Buffer[] = [];
      response.on('data', (chunk: Buffer) => chunks.push(chunk));
      response.once('end', () => resolve({ status: response.statusCode ?? 0, body: Buffer.concat(chunks).toString('utf8') }));
    });
    request.once('error', reject);
    request.end();
  });
}

it('getHost(port) names the sandbox port the proxy serves, with the traffic access token', async () => {
  const sandbox = await Sandbox.create(opts);
  try {
    await sandbox.files.write('/home/user/site/index.html', '<h1>from e2b</h1>');
    await sandbox.commands.run('python3 -m http.server 3000 --bind 127.0.0.1 --directory /home/user/site', { background: true });
    const host = sandbox.getHost(3000);
    expect(host).toBe(`3000-${sandbox.sandboxId}.${DOMAIN}`);
    const token = sandbox.trafficAccessToken ?? '';
    expect(token).not.toBe('');
    const page = await waitFor(async () => {
      const answer = await getByHost(host, '/index.html', { 'e2b-traffic-access-token': token });
      return answer.status === 502 ? undefined : answer;
    }, { timeoutMs: 60_000, what: 'the http.server in the E2B sandbox' });
    expect(page).toEqual({ status: 200, body: '<h1>from e2b</h1>' });
    expect((await getByHost(host, '/index.html', {})).status).toBe(401);
  } finally {
    await sandbox.kill();
  }
}, 120_000);

it("maps E2B's network options onto Capsule's policy, reports them, updates them, and refuses what it cannot honour", async () => {
  await expect(Sandbox.create({ ...opts, network: { denyOut: ['10.0.0.0/8'] } })).rejects.toThrow(/network\.denyOut cannot be honoured/);
  await expect(Sandbox.create({ ...opts, network: { allowPublicTraffic: true } })).rejects.toThrow(/allowPublicTraffic/);
  const policyOf = async (id: string) => (await t.json<{ spec: { network: { mode: string; allow: string[] } } }>('GET', `/v1/sandboxes/${id}`)).body.spec.network;
  // No packet is sent: the sandboxes only get their policies, read back through /v1 and getInfo().
  const listed = await Sandbox.create({ ...opts, network: { allowOut: ['pypi.org', '8.8.8.8'], denyOut: ['0.0.0.0/0'] } });
  const open = await Sandbox.create({ ...opts, allowInternetAccess: true });
  const closed = await Sandbox.create(opts);
  try {
    expect(await policyOf(listed.sandboxId)).toMatchObject({ mode: 'allowlist', allow: ['pypi.org', '8.8.8.8/32'] });
    expect(await listed.getInfo()).toMatchObject({ allowInternetAccess: false, network: { allowOut: ['pypi.org', '8.8.8.8/32'], denyOut: ['0.0.0.0/0'] } });
    expect(await policyOf(open.sandboxId)).toMatchObject({ mode: 'internet' });
    expect((await open.getInfo()).allowInternetAccess).toBe(true);
    expect(await closed.getInfo()).toMatchObject({ allowInternetAccess: false, network: { denyOut: ['0.0.0.0/0'] } });

    // PUT /sandboxes/{id}/network: replaces the policy; what the update omits is cleared.
    await listed.updateNetwork({ allowOut: ['example.com'] });
    expect(await policyOf(listed.sandboxId)).toMatchObject({ mode: 'allowlist', allow: ['example.com'] });
    await listed.updateNetwork({ allowInternetAccess: true });
    expect((await listed.getInfo()).allowInternetAccess).toBe(true);
    await open.updateNetwork({ denyOut: ['0.0.0.0/0'] });
    expect(await open.getInfo()).toMatchObject({ allowInternetAccess: false, network: { denyOut: ['0.0.0.0/0'] } });
    await expect(listed.updateNetwork({ denyOut: ['10.0.0.0/8'] })).rejects.toThrow(/network\.denyOut cannot be honoured/);
    // A refused update is in the audit log too: its attempt, and the failure.
    const audit = await t.json<{ records: { operation: string; phase: string; sandboxId: string | null; outcome: string | null }[] }>('GET', '/v1/audit?limit=1000');
    const updates = audit.body.records.filter((record) => record.operation === 'e2b.sandboxes.setNetwork' && record.sandboxId === listed.sandboxId);
    expect(updates.filter((record) => record.phase === 'attempt')).toHaveLength(3);
    expect(updates.some((record) => record.phase === 'outcome' && record.outcome !== 'ok')).toBe(true);
    // A sandbox made with no network has no namespace to open: said so, not ignored.
    await expect(closed.updateNetwork({ allowOut: ['example.com'] })).rejects.toThrow(/created without a network/);
    expect(await policyOf(closed.sandboxId)).toMatchObject({ mode: 'none' });
    // Closed on purpose at create (E2B's way to open it later): a network that reaches nothing, which an update opens.
    const later = await Sandbox.create({ ...opts, allowInternetAccess: false });
    try {
      expect(await later.getInfo()).toMatchObject({ allowInternetAccess: false, network: { denyOut: ['0.0.0.0/0'] } });
      await later.updateNetwork({ allowOut: ['example.com'] });
      expect(await policyOf(later.sandboxId)).toMatchObject({ mode: 'allowlist', allow: ['example.com'] });
    } finally {
      await later.kill();
    }
  } finally {
    await Promise.all([listed.kill(), open.kill(), closed.kill()]);
  }
}, 120_000);
