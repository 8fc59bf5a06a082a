import { afterEach, describe, expect, it } from 'vitest';
import { CapsuleMetrics } from '../../src/metrics/metrics.js';
import { MetricsHistory, quantile } from '../../src/server/console/metrics-history.js';
import { ConsoleSessions, LOGIN_TOKEN_PATTERN, SESSION_KEY_PATTERN } from '../../src/server/console/sessions.js';
import type { ApiKeyRecord } from '../../src/store/index.js';

/** Issue 17: the console's server-side pieces on an injected clock (no timers raced). */
const operator: ApiKeyRecord = { keyId: 'key_op', tenantId: 'default', name: null, isAdmin: true, createdAt: '2026-01-01T00:00:00.000Z', grants: { mountRoots: [] } };

describe('ConsoleSessions', () => {
  let clock = 1_000_000;
  const now = () => clock;

  it('redeems a login token once, and not after its lifetime', () => {
    const sessions = new ConsoleSessions({ now, loginTokenTtlMs: 60_000 });
    const { token } = sessions.mintLoginToken(operator);
    expect(token).toMatch(LOGIN_TOKEN_PATTERN);
    expect(sessions.redeemLoginToken(token)).toEqual(operator);
    expect(sessions.redeemLoginToken(token)).toBeUndefined();
    const late = sessions.mintLoginToken(operator).token;
    clock += 60_000;
    expect(sessions.redeemLoginToken(late)).toBeUndefined();
    expect(sessions.redeemLoginToken('clt_' + '0'.repeat(40))).toBeUndefined();
  });

  it('verifies a session key until it expires or is revoked; an API key is never a session', () => {
    const sessions = new ConsoleSessions({ now, sessionTtlMs: 1000 });
    const a = sessions.create(operator);
    const b = sessions.create(operator);
    expect(a.sessionKey).toMatch(SESSION_KEY_PATTERN);
    expect(sessions.verify(a.sessionKey)).toEqual(operator);
    expect(sessions.revoke(a.sessionKey)).toBe(true);
    expect(sessions.verify(a.sessionKey)).toBeUndefined();
    expect(sessions.revoke('cap_' + 'a'.repeat(40))).toBe(false);
    clock += 999;
    expect(sessions.expiresAt(b.sessionKey)).toBe(b.expiresAt);
    clock += 1;
    expect(sessions.verify(b.sessionKey)).toBeUndefined();
  });

  it('keeps at most maxSessions, dropping the oldest', () => {
    const sessions = new ConsoleSessions({ now, maxSessions: 2 });
    const [a, b, c] = [sessions.create(operator), sessions.create(operator), sessions.create(operator)];
    expect(sessions.verify(a.sessionKey)).toBeUndefined();
    expect(sessions.verify(b.sessionKey)).toEqual(operator);
    expect(sessions.verify(c.sessionKey)).toEqual(operator);
  });
});

describe('quantile over cumulative buckets', () => {
  it('interpolates inside the bucket the rank falls in, like histogram_quantile', () => {
    // 10 observations: 4 ≤ 0.1 s, 4 more ≤ 0.5 s, 2 more ≤ 1 s.
    const buckets = [
      [0.1, 4],
      [0.5, 8],
      [1, 10],
      [Infinity, 10],
    ] as const;
    expect(quantile(buckets, 0.5)).toBeCloseTo(0.1 + (0.4 * 1) / 4);
    expect(quantile(buckets, 0.95)).toBeCloseTo(0.5 + (0.5 * 1.5) / 2);
    expect(quantile(buckets, 0.2)).toBeCloseTo((0.1 * 2) / 4);
  });

  it('is null without observations and the largest finite bound in +Inf', () => {
    expect(quantile([[1, 0], [Infinity, 0]], 0.5)).toBeNull();
    expect(quantile([[1, 0], [Infinity, 3]], 0.5)).toBe(1);
  });
});

describe('MetricsHistory', () => {
  let history: MetricsHistory | undefined;
  afterEach(() => history?.close());

  it('gives create percentiles over its window: creates before it do not count', async () => {
    let clock = 0;
    const metrics = new CapsuleMetrics();
    history = new MetricsHistory(metrics.registry, { now: () => clock, intervalMs: 3_600_000, windowMs: 20_000 });
    for (let i = 0; i < 4; i++) metrics.recordCreate(2, { backend: 'namespace', poolWarm: false });
    await history.take(); // t=0: 4 slow creates so far
    for (let i = 0; i < 10; i++) metrics.recordCreate(0.04, { backend: 'namespace', poolWarm: false });
    metrics.recordLimitTermination('memory');
    clock = 15_000;
    const [first, now] = await history.samples();
    // At t=0 nothing older is kept: the 4 slow ones, in the (1, 2.5] bucket.
    expect(first!.creates[0]).toMatchObject({ backend: 'namespace', template: 'none', poolWarm: false, count: 4 });
    expect(first!.creates[0]!.p50).toBeGreaterThan(1);
    // Now: only the 10 fast ones since t=0, all in (0.025, 0.05]; with the slow ones p95 would be > 1 s.
    expect(now!.creates[0]).toMatchObject({ count: 10, p50: expect.closeTo(0.0375, 6) as unknown });
    expect(now!.creates[0]!.p95).toBeLessThanOrEqual(0.05);
    expect(now!.limitTerminations.memory).toBe(1);
  });

  it('keeps at most `capacity` samples, the oldest going first', async () => {
    let clock = 0;
    history = new MetricsHistory(new CapsuleMetrics().registry, { now: () => clock, intervalMs: 3_600_000, capacity: 2 });
    for (const at of [0, 10_000, 20_000]) {
      clock = at;
      await history.take();
    }
    clock = 30_000;
    // The two kept, plus one taken now.
    expect((await history.samples()).map((s) => Date.parse(s.timestamp))).toEqual([10_000, 20_000, 30_000]);
  });
});
