import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { NetworkNames } from '../../src/host/netns-pool.host.js';
import type { ExecResult } from '../../src/wire/index.js';
import type { SandboxInfo } from '../../src/wire/index.js';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { Sandbox, InvalidSpecError } from '../../src/sdk/index.js';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';
import { FakeInternet } from '../integration/network-fake-internet.js';
import { expectError, readNdjson, startTestServer, type TestServer } from './server-helpers.js';
import { runCli } from '../helpers/cli.js';

/*
 * Network policy over the HTTP API, the SDK and the CLI, with real sandboxes in real network
 * namespaces. Every destination is the fake internet (198.51.100.0/24 in a namespace this file
 * makes); the server's proxy resolves names only from the test's hosts map, so no query or packet
 * leaves the machine.
 */
let fake: FakeInternet;
let t: TestServer;

beforeAll(async () => {
  fake = new FakeInternet(new NetworkNames(new HostEnvironment({ dataDir: testDataDir() }).cgroupPrefix));
  await fake.start();
  t = await startTestServer({
    operatorDeny: ['operator-banned.test'],
    egressHosts: {
      'allowed.test': ['198.51.100.10'],
      'other.test': ['198.51.100.11'],
      'operator-banned.test': ['198.51.100.11'],
    },
  });
});

afterAll(async () => {
  await t?.server.close();
  await fake?.stop();
});

afterEach(expectNoLeaks);

async function create(network: Record<string, unknown>): Promise<SandboxInfo> {
  const created = await t.json<SandboxInfo>('POST', '/v1/sandboxes', { body: { spec: { network, limits: { wallClockMs: 15_000 } } } });
  expect(created.status, JSON.stringify(created.body)).toBe(201);
  return created.body;
}

async function sh(sandboxId: string, script: string): Promise<ExecResult> {
  const response = await t.call('POST', `/v1/sandboxes/${sandboxId}/processes`, { body: { argv: ['bash', '-c', script], timeoutMs: 15_000 } });
  expect(response.status).toBe(200);
  const exit = (await readNdjson(response)).find((e) => e.type === 'exit') as { result: ExecResult } | undefined;
  if (!exit) throw new Error(`sandbox ${sandboxId}: no exit event`);
  return exit.result;
}

/** The HTTP status curl got (proxy-aware: HTTP_PROXY is in the sandbox's environment). */
async function status(sandboxId: string, name: string): Promise<string> {
  return (await sh(sandboxId, `curl -sS -o /dev/null -w '%{http_code}' http://${name}/`)).stdout;
}

async function kill(sandboxId: string): Promise<void> {
  expect((await t.call('DELETE', `/v1/sandboxes/${sandboxId}`)).status).toBe(200);
}

describe('network policy over the HTTP API', () => {
  it('the server refuses to start with an operator deny entry that would match nothing', async () => {
    for (const entry of ['not a domain', '10.0.0.0/99', 'https://example.com/']) {
      await expect(startTestServer({ operatorDeny: ['example.com', entry] })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    }
  });

  it('an allowlist reaches the allowed host only; the operator deny list overrides it', async () => {
    const { sandboxId } = await create({ mode: 'allowlist', allow: ['allowed.test', 'operator-banned.test'] });
    try {
      const ok = await sh(sandboxId, 'curl -sS http://allowed.test/ok');
      expect(ok.stdout, JSON.stringify(ok)).toContain('hello from allowed.test');
      const denied = await sh(sandboxId, 'curl -sS http://other.test/');
      expect(JSON.parse(denied.stdout)).toMatchObject({ code: 'EGRESS_NOT_ALLOWED' });
      const banned = await sh(sandboxId, 'curl -sS http://operator-banned.test/');
      expect(JSON.parse(banned.stdout)).toMatchObject({ code: 'EGRESS_OPERATOR_DENY' });
      // Each denial is counted for the operator.
      const metrics = await (await fetch(`${t.url}/metrics`)).text();
      expect(Number(/^capsule_egress_blocked_total (\d+)$/m.exec(metrics)?.[1]), metrics).toBeGreaterThanOrEqual(2);
    } finally {
      await kill(sandboxId);
    }
  });

  it('PUT /network replaces the policy at run time: the old grant is gone, the new one works, and it is audited', async () => {
    const { sandboxId } = await create({ mode: 'allowlist', allow: ['allowed.test'] });
    try {
      expect(await status(sandboxId, 'allowed.test')).toBe('200');
      expect(await status(sandboxId, 'other.test')).toBe('403');
      const changed = await t.json<SandboxInfo>('PUT', `/v1/sandboxes/${sandboxId}/network`, { body: { mode: 'allowlist', allow: ['other.test'] } });
      expect(changed.status, JSON.stringify(changed.body)).toBe(200);
      expect(changed.body.spec.network).toMatchObject({ mode: 'allowlist', allow: ['other.test'], handles: [] });
      expect(await status(sandboxId, 'allowed.test')).toBe('403');
      expect(await status(sandboxId, 'other.test')).toBe('200');
      // The record keeps the new policy.
      expect((await t.json<SandboxInfo>('GET', `/v1/sandboxes/${sandboxId}`)).body.spec.network.allow).toEqual(['other.test']);

      const audit = await t.json<{ records: { operation: string; phase: string; sandboxId: string | null; policy: string | null; outcome: string | null }[] }>('GET', '/v1/audit?limit=1000');
      const attempt = audit.body.records.find((r) => r.operation === 'sandboxes.setNetwork' && r.phase === 'attempt' && r.sandboxId === sandboxId);
      expect(attempt?.policy && JSON.parse(attempt.policy)).toMatchObject({ network: { mode: 'allowlist', allow: ['other.test'] } });
      const outcome = audit.body.records.find((r) => r.operation === 'sandboxes.setNetwork' && r.phase === 'outcome' && r.sandboxId === sandboxId);
      expect(outcome?.outcome).toBe('ok');

      // An invalid policy is refused by the spec's schema, naming the field; the policy stays.
      const bad = await t.json('PUT', `/v1/sandboxes/${sandboxId}/network`, { body: { mode: 'allowlist', allow: ['*'] } });
      expect(bad.status).toBe(422);
      expectError(bad.body, 'INVALID_SPEC');
      expect(await status(sandboxId, 'other.test')).toBe('200');
    } finally {
      await kill(sandboxId);
    }
  });

  it('a sandbox created with mode none refuses a policy change with BACKEND_CANNOT_ENFORCE', async () => {
    const { sandboxId } = await create({ mode: 'none' });
    try {
      const refused = await t.json('PUT', `/v1/sandboxes/${sandboxId}/network`, { body: { mode: 'allowlist', allow: ['allowed.test'] } });
      expect(refused.status).toBe(422);
      expectError(refused.body, 'BACKEND_CANNOT_ENFORCE');
      expect((await t.json<SandboxInfo>('GET', `/v1/sandboxes/${sandboxId}`)).body.spec.network.mode).toBe('none');
      // Unknown sandboxes are 404, as everywhere.
      const missing = await t.json('PUT', '/v1/sandboxes/aaaaaaaaaaaaaaaaaaaa/network', { body: { mode: 'none' } });
      expect(missing.status).toBe(404);
    } finally {
      await kill(sandboxId);
    }
  });

  it('SDK: sandbox.setNetwork changes the policy; a sandbox without a network throws InvalidSpecError', async () => {
    const connection = { url: t.url, apiKey: t.apiKey };
    const sandbox = await Sandbox.create({ network: { mode: 'allowlist', allow: [] }, limits: { wallClockMs: 15_000 } }, connection);
    const offline = await Sandbox.create({}, connection);
    try {
      expect(await status(sandbox.sandboxId, 'allowed.test')).toBe('403');
      const info = await sandbox.setNetwork({ mode: 'allowlist', allow: ['allowed.test'] });
      expect(info.spec.network.allow).toEqual(['allowed.test']);
      expect(sandbox.info.spec.network.allow).toEqual(['allowed.test']);
      expect(await status(sandbox.sandboxId, 'allowed.test')).toBe('200');
      const error = await offline.setNetwork({ mode: 'internet' }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(InvalidSpecError);
      expect((error as InvalidSpecError).code).toBe('BACKEND_CANNOT_ENFORCE');
    } finally {
      await sandbox.kill();
      await offline.kill();
    }
  });

  it('CLI: capsule sandbox create --network allowlist --allow, then capsule sandbox network', async () => {
    const env = { CAPSULE_URL: t.url, CAPSULE_API_KEY: t.apiKey };
    const cli = (...argv: string[]) => runCli(argv, env);
    const created = await cli('sandbox', 'create', '--network', 'allowlist', '--allow', 'allowed.test', '--wall-clock', '15s', '--json');
    expect(created.code, created.stderr).toBe(0);
    const info = JSON.parse(created.stdout) as SandboxInfo;
    try {
      expect(info.spec.network).toMatchObject({ mode: 'allowlist', allow: ['allowed.test'], handles: [] });
      const changed = await cli('sandbox', 'network', info.sandboxId, '--network', 'allowlist', '--allow', 'other.test', '--json');
      expect(changed.code, changed.stderr).toBe(0);
      expect((JSON.parse(changed.stdout) as SandboxInfo).spec.network.allow).toEqual(['other.test']);
      expect(await status(info.sandboxId, 'other.test')).toBe('200');
      const text = await cli('sandbox', 'network', info.sandboxId, '--network', 'none');
      expect(text.code, text.stderr).toBe(0);
      expect(text.stdout).toBe('network   none\n');
      expect(await status(info.sandboxId, 'other.test')).toBe('403');
      // A handle needs a network: the spec says so before anything is created.
      const refused = await cli('sandbox', 'create', '--handle', 'docs.read', '--json');
      expect(refused.code).not.toBe(0);
      expect(refused.stdout + refused.stderr).toContain('INVALID_SPEC');
    } finally {
      await kill(info.sandboxId);
    }
  });
});
