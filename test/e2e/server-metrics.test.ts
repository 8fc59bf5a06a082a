import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { expectNoLeaks } from '../helpers/sandbox.js';
import { readNdjson, startTestServer, type TestServer } from './server-helpers.js';

let t: TestServer;
beforeAll(async () => {
  t = await startTestServer();
});
afterAll(async () => {
  await t.server.close();
  await expectNoLeaks();
});
afterEach(async () => {
  const { body } = await t.json<{ sandboxes: { sandboxId: string }[] }>('GET', '/v1/sandboxes?state=starting,running,paused&limit=100');
  for (const s of body.sandboxes) await t.call('DELETE', `/v1/sandboxes/${s.sandboxId}`);
  await expectNoLeaks();
});

/** Parses the Prometheus text into `name{labels}` → value. */
async function scrape(): Promise<Map<string, number>> {
  const response = await t.call('GET', '/metrics', { key: null });
  expect(response.status).toBe(200);
  expect(response.headers.get('content-type')).toMatch(/^text\/plain/);
  const series = new Map<string, number>();
  for (const line of (await response.text()).split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const at = line.lastIndexOf(' ');
    series.set(line.slice(0, at), Number(line.slice(at + 1)));
  }
  return series;
}

const value = (m: Map<string, number>, key: string): number => m.get(key) ?? 0;

async function create(spec: unknown = {}): Promise<string> {
  const r = await t.json<{ sandboxId: string }>('POST', '/v1/sandboxes', { body: { spec } });
  expect(r.status, JSON.stringify(r.body)).toBe(201);
  return r.body.sandboxId;
}

async function exec(id: string, body: unknown): Promise<{ outcome: string; limit?: { resource: string } }> {
  const response = await t.call('POST', `/v1/sandboxes/${id}/processes`, { body });
  expect(response.status).toBe(200);
  const events = await readNdjson(response);
  const exit = events.at(-1) as { type: string; result: { outcome: string; limit?: { resource: string } } };
  expect(exit.type).toBe('exit');
  return exit.result;
}

describe('GET /metrics', () => {
  it('moves the create histogram, the active gauge, exec totals and API requests by route pattern', async () => {
    const before = await scrape();
    const id = await create();
    const running = await scrape();
    const createCount = 'capsule_sandbox_create_duration_seconds_count{backend="namespace",template="host",pool_warm="false"}';
    expect(value(running, createCount)).toBe(value(before, createCount) + 1);
    expect(value(running, 'capsule_active_sandboxes')).toBe(value(before, 'capsule_active_sandboxes') + 1);

    expect((await exec(id, { argv: ['true'] })).outcome).toBe('ok');
    const afterExec = await scrape();
    const ok = 'capsule_execs_total{backend="namespace",outcome="ok"}';
    expect(value(afterExec, ok)).toBe(value(before, ok) + 1);
    expect(value(afterExec, 'capsule_exec_duration_seconds_count{backend="namespace"}')).toBe(value(before, 'capsule_exec_duration_seconds_count{backend="namespace"}') + 1);
    // The pattern, never the URL: no sandbox id in any label.
    expect(value(afterExec, 'capsule_api_requests_total{route="/v1/sandboxes/:sandboxId/processes",method="POST",status="200"}')).toBe(1);
    expect(value(afterExec, 'capsule_api_requests_total{route="/v1/sandboxes",method="POST",status="201"}')).toBeGreaterThanOrEqual(1);
    expect([...afterExec.keys()].some((k) => k.includes(id))).toBe(false);

    await t.call('GET', '/v1/sandboxes/aaaaaaaaaaaaaaaaaaaa');
    await t.call('GET', '/no/such/route');
    await t.call('DELETE', `/v1/sandboxes/${id}`);
    const after = await scrape();
    expect(value(after, 'capsule_api_requests_total{route="/v1/sandboxes/:sandboxId",method="GET",status="404"}')).toBe(1);
    expect(value(after, 'capsule_api_requests_total{route="unmatched",method="GET",status="404"}')).toBe(1);
    expect(value(after, 'capsule_active_sandboxes')).toBe(value(before, 'capsule_active_sandboxes'));
  });

  it('counts limit terminations by resource: memory and wall clock', async () => {
    const id = await create({ limits: { memoryBytes: 64 * 1024 * 1024, wallClockMs: 60_000 } });
    const before = await scrape();
    const oom = await exec(id, { argv: ['python3', '-c', 'b = bytearray(256 * 1024 * 1024)'] });
    expect(oom).toMatchObject({ outcome: 'limit_exceeded', limit: { resource: 'memory' } });
    const wall = await exec(id, { argv: ['sleep', '30'], timeoutMs: 300 });
    expect(wall).toMatchObject({ outcome: 'limit_exceeded', limit: { resource: 'wall_clock' } });
    const after = await scrape();
    for (const resource of ['memory', 'wall_clock']) {
      const key = `capsule_limit_terminations_total{resource="${resource}"}`;
      expect(value(after, key), resource).toBe(value(before, key) + 1);
    }
    const limited = 'capsule_execs_total{backend="namespace",outcome="limit_exceeded"}';
    expect(value(after, limited)).toBe(value(before, limited) + 2);
    expect(value(after, 'capsule_limit_terminations_total{resource="cpu"}')).toBe(value(before, 'capsule_limit_terminations_total{resource="cpu"}'));
  });

  it('counts artifact deliveries by outcome: ok and too_large', async () => {
    const id = await create();
    await exec(id, { argv: ['sh', '-c', 'mkdir -p output && head -c 1000 /dev/zero > output/small && head -c 3000000 /dev/zero > output/big'] });
    const before = await scrape();
    const r = await t.json<{ artifacts: { name: string; skipped?: string }[] }>('POST', `/v1/sandboxes/${id}/artifacts`, { body: { maxFileBytes: 1024 * 1024 } });
    expect(r.status, JSON.stringify(r.body)).toBe(200);
    const after = await scrape();
    expect(value(after, 'capsule_artifact_deliveries_total{outcome="ok"}')).toBe(value(before, 'capsule_artifact_deliveries_total{outcome="ok"}') + 1);
    expect(value(after, 'capsule_artifact_deliveries_total{outcome="too_large"}')).toBe(value(before, 'capsule_artifact_deliveries_total{outcome="too_large"}') + 1);
  });

  it('declares egress_blocked_total and exposes the metrics object to other seams', async () => {
    const before = await scrape();
    expect(before.has('capsule_egress_blocked_total')).toBe(true);
    t.server.app.services.metrics?.recordEgressBlocked();
    expect(value(await scrape(), 'capsule_egress_blocked_total')).toBe(value(before, 'capsule_egress_blocked_total') + 1);
  });
});

describe('GET /v1/sandboxes/{id}/metrics', () => {
  it('returns usage samples of a live sandbox and 404 for an unknown one', async () => {
    const id = await create();
    await exec(id, { argv: ['sh', '-c', 'head -c 2000000 /dev/urandom > blob'] });
    const r = await t.json<{ samples: { timestamp: string; cpuUsedPct: number; cpuTimeMs: number; memoryBytes: number; memoryPeakBytes: number; diskBytes: number | null }[] }>(
      'GET',
      `/v1/sandboxes/${id}/metrics`,
    );
    expect(r.status).toBe(200);
    expect(r.body.samples.length).toBeGreaterThanOrEqual(1);
    const last = r.body.samples.at(-1)!;
    expect(Date.parse(last.timestamp)).toBeGreaterThan(Date.now() - 60_000);
    expect(last.cpuTimeMs).toBeGreaterThan(0);
    expect(last.memoryBytes).toBeGreaterThan(0);
    expect(last.cpuUsedPct).toBeGreaterThanOrEqual(0);
    expect(last.cpuUsedPct).toBeLessThanOrEqual(100);
    // btrfs accounts quota at transaction commit: a fresh write may not show yet.
    if (last.diskBytes !== null) expect(last.diskBytes).toBeGreaterThanOrEqual(0);
    const second = await t.json<{ samples: unknown[] }>('GET', `/v1/sandboxes/${id}/metrics`);
    expect(second.body.samples.length).toBe(r.body.samples.length + 1);

    expect((await t.json('GET', '/v1/sandboxes/aaaaaaaaaaaaaaaaaaaa/metrics')).status).toBe(404);
  });
});
