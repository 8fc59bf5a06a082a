import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { join } from 'node:path';
import type { ExecResult } from '../../src/wire/index.js';
import type { SandboxInfo } from '../../src/wire/index.js';
import { CredentialBroker } from '../../src/host/egress/broker.js';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { NetworkNames } from '../../src/host/netns-pool.host.js';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';
import { FakeInternet } from '../integration/network-fake-internet.js';
import { expectError, readNdjson, startTestServer, type TestServer } from './server-helpers.js';

/*
 * Two tenants on one real server (issue 11, findings 3 and 6): what one tenant's sandbox does to
 * the egress proxy must not take the API or another tenant's network down, and a credential
 * handle is spent only by the tenants the operator granted it to. Every destination is the fake
 * internet (198.51.100.0/24 in a namespace this file makes) or the proxy; the proxy resolves names
 * only from the test's hosts map, so no query or packet leaves the machine.
 */
let fake: FakeInternet;
let t: TestServer;
let keyA: string;
let keyB: string;
let logs = '';

beforeAll(async () => {
  fake = new FakeInternet(new NetworkNames(new HostEnvironment({ dataDir: testDataDir() }).cgroupPrefix));
  await fake.start();
  t = await startTestServer({
    egressHosts: { 'allowed.test': ['198.51.100.10'] },
    logger: { level: 'warn', stream: { write: (line: string) => void (logs += line) } },
  });
  const mint = async (tenantId: string): Promise<string> => {
    const minted = await t.json<{ apiKey: string }>('POST', '/v1/keys', { body: { tenantId } });
    expect(minted.status).toBe(201);
    return minted.body.apiKey;
  };
  keyA = await mint('tenant-a');
  keyB = await mint('tenant-b');
});

afterAll(async () => {
  await t?.server.close();
  await fake?.stop();
});

afterEach(expectNoLeaks);

async function create(key: string, spec: Record<string, unknown>): Promise<SandboxInfo> {
  const created = await t.json<SandboxInfo>('POST', '/v1/sandboxes', { key, body: { spec } });
  expect(created.status, JSON.stringify(created.body)).toBe(201);
  return created.body;
}

async function kill(key: string, sandboxId: string): Promise<void> {
  expect((await t.call('DELETE', `/v1/sandboxes/${sandboxId}`, { key })).status).toBe(200);
}

async function sh(key: string, sandboxId: string, script: string): Promise<ExecResult> {
  const response = await t.call('POST', `/v1/sandboxes/${sandboxId}/processes`, { key, body: { argv: ['bash', '-c', script], timeoutMs: 20_000 } });
  expect(response.status).toBe(200);
  const exit = (await readNdjson(response)).find((e) => e.type === 'exit') as { result: ExecResult } | undefined;
  if (!exit) throw new Error(`sandbox ${sandboxId}: no exit event`);
  return exit.result;
}

/** The 99th percentile of `samples` (nearest rank). */
function p99(samples: number[]): number {
  const sorted = [...samples].sort((a, b) => a - b);
  return sorted[Math.max(0, Math.ceil(sorted.length * 0.99) - 1)] ?? Number.POSITIVE_INFINITY;
}

/**
 * Opens CONNECTIONS connections to the egress proxy as fast as it can, each asking for a tunnel
 * to an allowed host (two descriptors in the proxy per tunnel), holds them until
 * /workspace/release appears (60 s at most), then reports how many are still open and exits 1
 * when any was refused, like a program that fails when its connections fail.
 */
const FLOOD = String.raw`
import json, os, socket, sys, time
CONNECTIONS = 10000
host, port = os.environ['HTTP_PROXY'][len('http://'):].rsplit(':', 1)
request = b'CONNECT allowed.test:80 HTTP/1.1\r\nHost: allowed.test:80\r\n\r\n'
held, refused, started = [], 0, time.monotonic()
deadline = started + 60
for _ in range(CONNECTIONS):
    if time.monotonic() > deadline:
        break
    s = socket.socket()
    try:
        s.connect((host, int(port)))
        s.sendall(request)
        held.append(s)
    except OSError:
        refused += 1
        s.close()
print('flooded in %.1f s' % (time.monotonic() - started), flush=True)
while not os.path.exists('/workspace/release') and time.monotonic() < deadline:
    time.sleep(0.05)
alive = 0
for s in held:
    s.settimeout(2)
    try:
        alive += 1 if s.recv(4096).startswith(b'HTTP/1.1 200') else 0
    except OSError:
        pass
attempted = len(held) + refused
refused += len(held) - alive
print(json.dumps({'attempted': attempted, 'alive': alive, 'refused': refused}), flush=True)
sys.exit(1 if refused else 0)
`;

describe('one tenant cannot exhaust the egress proxy for the others (finding 3)', () => {
  it("tenant A's 10,000 proxy connections: B's creates and /healthz answer (p99 < 1 s), B's egress works, A is told it hit an egress limit", async () => {
    const b = await create(keyB, { network: { mode: 'allowlist', allow: ['allowed.test'] }, limits: { wallClockMs: 30_000 } });
    const a = await create(keyA, {
      // The lifetime count is raised out of the way: only the concurrent limit (default 256) bounds A.
      network: { mode: 'allowlist', allow: ['allowed.test'], maxConnections: 1_000_000 },
      limits: { openFiles: 12_000, wallClockMs: 120_000 },
    });
    /** Creates and kills one sandbox of B; its create's latency in ms. */
    const probeCreate = async (): Promise<number> => {
      const begun = performance.now();
      const { sandboxId } = await create(keyB, {});
      const latency = performance.now() - begun;
      await kill(keyB, sandboxId);
      return latency;
    };
    try {
      // For the report: B's creates before the attack, on this machine at this moment.
      const baseline: number[] = [];
      for (let i = 0; i < 5; i++) baseline.push(await probeCreate());
      const put = await t.call('PUT', `/v1/sandboxes/${a.sandboxId}/files?path=flood.py`, { key: keyA, raw: FLOOD });
      expect(put.status).toBe(200);
      const started = await t.call('POST', `/v1/sandboxes/${a.sandboxId}/processes`, { key: keyA, body: { argv: ['python3', 'flood.py'], timeoutMs: 110_000 } });
      expect(started.status).toBe(200);

      // A's events, read as they come: 'flooded' once every connection was tried.
      let stdout = '';
      let flooded!: () => void;
      const floodedSeen = new Promise<void>((resolve) => (flooded = resolve));
      const exited = (async (): Promise<ExecResult> => {
        const reader = started.body!.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = '';
        for (;;) {
          const { value, done } = await reader.read();
          if (done) throw new Error(`sandbox ${a.sandboxId}: the event stream ended without an exit; stdout: ${stdout}`);
          buffer += value;
          for (let at = buffer.indexOf('\n'); at !== -1; at = buffer.indexOf('\n')) {
            const event = JSON.parse(buffer.slice(0, at)) as { type: string; data?: string; result?: ExecResult };
            buffer = buffer.slice(at + 1);
            if (event.type === 'stdout') stdout += Buffer.from(event.data ?? '', 'base64').toString();
            if (stdout.includes('flooded in')) flooded();
            if (event.type === 'exit' && event.result) return event.result;
          }
        }
      })();
      let running = true;
      void exited.finally(() => (running = false)).catch(() => undefined);

      // Probes for as long as A runs, bounded in count: /healthz every 50 ms, B's creates back to back.
      const health: number[] = [];
      const creates: number[] = [];
      const healthProbes = (async () => {
        while (running && health.length < 1200) {
          const begun = performance.now();
          const response = await fetch(`${t.url}/healthz`);
          expect(response.status).toBe(200);
          health.push(performance.now() - begun);
          await new Promise((resolve) => setTimeout(resolve, 50));
        }
      })();
      const createProbes = (async () => {
        while (running && creates.length < 12) creates.push(await probeCreate());
      })();

      await floodedSeen;
      // While A holds all it could open, B's sandbox still reaches the allowed host through the proxy.
      const reach = await sh(keyB, b.sandboxId, 'curl -sS --max-time 10 http://allowed.test/ok');
      expect(reach.stdout, JSON.stringify(reach)).toContain('hello from allowed.test');
      const release = await t.call('PUT', `/v1/sandboxes/${a.sandboxId}/files?path=release`, { key: keyA, raw: '' });
      expect(release.status).toBe(200);
      const result = await exited;
      await Promise.all([healthProbes, createProbes]);

      // A was held at its limit and told so, as an egress limit.
      const report = JSON.parse(stdout.split('\n').find((line) => line.startsWith('{')) ?? '{}') as { attempted: number; alive: number; refused: number };
      expect(report.attempted, stdout).toBe(10_000);
      expect(report.alive).toBeLessThanOrEqual(256);
      expect(report.refused).toBeGreaterThanOrEqual(10_000 - 256);
      expect(result.outcome, JSON.stringify(result)).toBe('limit_exceeded');
      expect(result.limit).toMatchObject({ resource: 'egress', limit: 256, unit: 'count' });
      expect(result.limit?.message).toMatch(/^concurrent connection limit 256 reached \(\d+ connections refused/);

      // The API answered throughout: p99 under one second for /healthz and B's creates.
      expect(health.length).toBeGreaterThanOrEqual(10);
      expect(creates.length).toBeGreaterThanOrEqual(2);
      const measured =
        `healthz n=${health.length} p99=${p99(health).toFixed(1)} ms; create n=${creates.length} p99=${p99(creates).toFixed(1)} ms ` +
        `(before the attack: n=${baseline.length} p99=${p99(baseline).toFixed(1)} ms)`;
      console.log(`tenancy-egress: ${measured}; ${stdout.split('\n')[0]}; creates ${creates.map((c) => c.toFixed(0)).join(' ')}`);
      expect(p99(health), measured).toBeLessThan(1000);
      expect(p99(creates), measured).toBeLessThan(1000);

      // Thousands of refusals, a handful of log lines (repeats are summed).
      const egressLines = logs.split('\n').filter((line) => line.includes('"egress"') && line.includes(a.sandboxId));
      console.log(`tenancy-egress: ${report.refused} refusals of A, ${egressLines.length} egress log lines about A`);
      expect(egressLines.length).toBeGreaterThanOrEqual(1);
      expect(egressLines.length).toBeLessThanOrEqual(20);
    } finally {
      await kill(keyA, a.sandboxId);
      await kill(keyB, b.sandboxId);
    }
  });
});

describe('credential handles are tenant grants (finding 6)', () => {
  const broker = new CredentialBroker({ dir: join(testDataDir(), 'broker') });
  const handle = {
    upstream: 'http://127.0.0.1:9/v1', methods: ['GET'], pathPrefixes: ['/'], secret: 'tenancy-token', headers: { Authorization: 'Bearer {{secret}}' }, maxResponseBytes: 1024,
  };
  beforeAll(async () => {
    await broker.setSecret('tenancy-token', 'tenancy-secret-value-0b1d');
    await broker.registerHandle({ ...handle, name: 'tenancy.acme', tenants: ['tenant-a'] });
    await broker.registerHandle({ ...handle, name: 'tenancy.operator' });
  });
  afterAll(async () => {
    await broker.removeHandle('tenancy.acme');
    await broker.removeHandle('tenancy.operator');
    await broker.removeSecret('tenancy-token');
  });

  it('refuses a create or a policy update naming a handle not granted to the tenant, naming the handle', async () => {
    const network = (handles: string[]) => ({ network: { mode: 'allowlist', allow: [], handles } });
    for (const handles of [['tenancy.acme'], ['tenancy.operator'], ['tenancy.nope']]) {
      const refused = await t.json<{ message: string; hint: string; details: { handles: string[] } }>('POST', '/v1/sandboxes', { key: keyB, body: { spec: network(handles) } });
      expect(refused.status, JSON.stringify(refused.body)).toBe(403);
      expectError(refused.body, 'PERMISSION_DENIED');
      expect(refused.body.message).toBe(`credential handle "${handles[0]}" is not granted to tenant "tenant-b"`);
      expect(refused.body.details.handles).toEqual(handles);
      expect(refused.body.hint).toMatch(/Remove .* from network.handles, or ask the operator to grant it/);
    }
    expect((await t.json<{ sandboxes: SandboxInfo[] }>('GET', '/v1/sandboxes?state=starting&state=running', { key: keyB })).body.sandboxes).toEqual([]);

    // The tenant it is granted to, and the operator for an ungranted handle, may.
    const granted = await create(keyA, network(['tenancy.acme']));
    const operators = await create(t.apiKey, network(['tenancy.operator']));
    const mine = await create(keyB, network([]));
    try {
      const update = await t.json('PUT', `/v1/sandboxes/${mine.sandboxId}/network`, { key: keyB, body: { mode: 'allowlist', handles: ['tenancy.operator', 'tenancy.acme'] } });
      expect(update.status).toBe(403);
      expectError(update.body, 'PERMISSION_DENIED');
      expect((update.body as { message: string }).message).toBe('credential handles "tenancy.operator", "tenancy.acme" are not granted to tenant "tenant-b"');
      expect((await t.json<SandboxInfo>('GET', `/v1/sandboxes/${mine.sandboxId}`, { key: keyB })).body.spec.network.handles).toEqual([]);
      // The owner of the grant can change its policy to it.
      const ok = await t.json<SandboxInfo>('PUT', `/v1/sandboxes/${granted.sandboxId}/network`, { key: keyA, body: { mode: 'allowlist', handles: ['tenancy.acme'] } });
      expect(ok.status, JSON.stringify(ok.body)).toBe(200);
    } finally {
      await kill(keyA, granted.sandboxId);
      await kill(t.apiKey, operators.sandboxId);
      await kill(keyB, mine.sandboxId);
    }
  });
});
