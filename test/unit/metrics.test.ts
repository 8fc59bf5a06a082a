import { describe, expect, it } from 'vitest';
import { CapsuleMetrics } from '../../src/metrics/metrics.js';

/** The value of one series in Prometheus text, 0 when the series is absent. */
function sample(text: string, series: string): number {
  const line = text.split('\n').find((l) => l.startsWith(`${series} `));
  return line === undefined ? 0 : Number(line.slice(series.length + 1));
}

async function moves(metrics: CapsuleMetrics, series: string, event: () => void): Promise<[number, number]> {
  const before = sample(await metrics.render(), series);
  event();
  return [before, sample(await metrics.render(), series)];
}

describe('CapsuleMetrics: each metric moves when its event happens', () => {
  it('counts execs by backend and outcome and observes their duration', async () => {
    const m = new CapsuleMetrics();
    const [b, a] = await moves(m, 'capsule_execs_total{backend="namespace",outcome="exit_nonzero"}', () =>
      m.recordExec({ outcome: 'exit_nonzero', durationMs: 1500 }, 'namespace'),
    );
    expect([b, a]).toEqual([0, 1]);
    const text = await m.render();
    expect(sample(text, 'capsule_exec_duration_seconds_count{backend="namespace"}')).toBe(1);
    expect(sample(text, 'capsule_exec_duration_seconds_sum{backend="namespace"}')).toBe(1.5);
    expect(sample(text, 'capsule_exec_duration_seconds_bucket{le="2.5",backend="namespace"}')).toBe(1);
    expect(sample(text, 'capsule_exec_duration_seconds_bucket{le="1",backend="namespace"}')).toBe(0);
  });

  it('counts a limit termination by resource, from an exec result or directly (egress)', async () => {
    const m = new CapsuleMetrics();
    const limit = { resource: 'memory' as const, limit: 1, used: 2, unit: 'bytes' as const, message: 'memory' };
    expect(await moves(m, 'capsule_limit_terminations_total{resource="memory"}', () =>
      m.recordExec({ outcome: 'limit_exceeded', durationMs: 10, limit }, 'namespace'),
    )).toEqual([0, 1]);
    expect(await moves(m, 'capsule_limit_terminations_total{resource="egress"}', () => m.recordLimitTermination('egress'))).toEqual([0, 1]);
    // Every resource series exists from the start, so the per-resource rate is 0, not absent.
    const text = await m.render();
    for (const r of ['cpu', 'memory', 'disk', 'wall_clock', 'pids', 'output', 'file_size', 'egress']) {
      expect(text).toContain(`capsule_limit_terminations_total{resource="${r}"}`);
    }
    expect(sample(text, 'capsule_execs_total{backend="namespace",outcome="limit_exceeded"}')).toBe(1);
  });

  it('observes create latency by backend, template and pool_warm', async () => {
    const m = new CapsuleMetrics();
    const series = 'capsule_sandbox_create_duration_seconds_count{backend="namespace",template="none",pool_warm="true"}';
    expect(await moves(m, series, () => m.recordCreate(0.02, { backend: 'namespace', poolWarm: true }))).toEqual([0, 1]);
    m.recordCreate(0.3, { backend: 'namespace', template: 'python', poolWarm: false });
    const text = await m.render();
    expect(sample(text, 'capsule_sandbox_create_duration_seconds_bucket{le="0.025",backend="namespace",template="none",pool_warm="true"}')).toBe(1);
    expect(sample(text, 'capsule_sandbox_create_duration_seconds_count{backend="namespace",template="python",pool_warm="false"}')).toBe(1);
  });

  it('counts egress blocks, artifact deliveries by outcome, active sandboxes and API requests', async () => {
    const m = new CapsuleMetrics();
    expect(await moves(m, 'capsule_egress_blocked_total', () => m.recordEgressBlocked())).toEqual([0, 1]);
    for (const outcome of ['ok', 'too_large', 'verify_failed', 'skipped'] as const) {
      expect(await moves(m, `capsule_artifact_deliveries_total{outcome="${outcome}"}`, () => m.recordArtifact(outcome))).toEqual([0, 1]);
    }
    expect(await moves(m, 'capsule_active_sandboxes', () => m.setActive(3))).toEqual([0, 3]);
    expect(await moves(m, 'capsule_api_requests_total{route="/v1/sandboxes/:id",method="GET",status="404"}', () =>
      m.recordRequest('/v1/sandboxes/:id', 'get', 404),
    )).toEqual([0, 1]);
  });

  it('owns its registry: two instances do not share series, and the default registry stays empty', async () => {
    const { register } = await import('prom-client');
    const a = new CapsuleMetrics();
    const b = new CapsuleMetrics();
    a.recordEgressBlocked(5);
    expect(sample(await a.render(), 'capsule_egress_blocked_total')).toBe(5);
    expect(sample(await b.render(), 'capsule_egress_blocked_total')).toBe(0);
    expect(await register.metrics()).not.toContain('capsule_');
    expect(a.contentType).toMatch(/^text\/plain/);
  });

  it('has no per-sandbox label on any metric', async () => {
    const m = new CapsuleMetrics();
    m.recordExec({ outcome: 'ok', durationMs: 5 }, 'namespace');
    const labels = new Set([...(await m.render()).matchAll(/[{,]([a-z_]+)="/g)].map((x) => x[1]));
    m.recordCreate(0.1, { backend: 'namespace', poolWarm: false });
    m.recordRequest('/v1/sandboxes', 'POST', 201);
    const allowed = new Set(['backend', 'le', 'method', 'outcome', 'pool_warm', 'resource', 'route', 'status', 'template']);
    expect([...labels].filter((l) => !allowed.has(l!))).toEqual([]);
  });
});
