import { describe, expect, it, vi } from 'vitest';
import type { BackendSandbox, SandboxCounters } from '../../src/backends/backend.js';
import { UsageSampler } from '../../src/engine/usage-sampler.js';

/** Only what the sampler reads of a backend sandbox: counters, disk use and the cpu limit. */
function fakeSandbox(id: string, counters: () => Partial<SandboxCounters>, disk: () => number | undefined = () => 4096): BackendSandbox {
  return {
    id,
    spec: { limits: { cpus: 2 } },
    counters: () => Promise.resolve({ oomKills: 0, pidsMaxEvents: 0, memoryPeakBytes: 2000, memoryUsageBytes: 1000, cpuUsageUsec: 0, cpuThrottledUsec: 0, ...counters() }),
    diskUsedBytes: () => Promise.resolve(disk()),
  } as unknown as BackendSandbox;
}

describe('UsageSampler', () => {
  it('computes the CPU share since the previous sample against limits.cpus', async () => {
    let now = 1_000_000;
    let cpuUsec = 0;
    const sampler = new UsageSampler({ now: () => now, intervalMs: 60_000 });
    sampler.track(fakeSandbox('a', () => ({ cpuUsageUsec: cpuUsec })), now);
    now += 1000;
    cpuUsec = 1_000_000; // 1 s of CPU in 1 s on 2 cpus: 50 %
    const [first] = await sampler.samples('a');
    expect(first).toEqual({ timestamp: new Date(now).toISOString(), cpuUsedPct: 50, cpuTimeMs: 1000, memoryBytes: 1000, memoryPeakBytes: 2000, diskBytes: 4096 });
    now += 1000; // idle since
    expect((await sampler.samples('a')).at(-1)?.cpuUsedPct).toBe(0);
    sampler.close();
  });

  it('keeps a bounded ring per sandbox and the samples of a bounded number of ended sandboxes', async () => {
    const sampler = new UsageSampler({ capacity: 3, keepEnded: 1, intervalMs: 60_000 });
    sampler.track(fakeSandbox('a', () => ({}), () => undefined));
    for (let i = 0; i < 5; i++) await sampler.samples('a');
    const kept = await sampler.samples('a');
    expect(kept).toHaveLength(3);
    expect(kept.at(-1)?.diskBytes).toBeNull();

    sampler.untrack('a');
    expect(await sampler.samples('a')).toHaveLength(3); // no new sample once ended
    sampler.track(fakeSandbox('b', () => ({})));
    sampler.untrack('b');
    expect(await sampler.samples('a')).toEqual([]); // pushed out by b
    expect(await sampler.samples('b')).toEqual([]); // b had no samples yet
    expect(await sampler.samples('unknown')).toEqual([]);
    sampler.close();
  });

  it('gives no sample (and no error) for a sandbox whose counters are gone', async () => {
    const sampler = new UsageSampler({ intervalMs: 60_000 });
    const gone = { ...fakeSandbox('c', () => ({})), id: 'c', counters: () => Promise.reject(new Error('ENOENT')) } as unknown as BackendSandbox;
    sampler.track(gone);
    expect(await sampler.samples('c')).toEqual([]);
    sampler.close();
  });
});

describe('UsageSampler scheduling', () => {
  it('reads each sandbox every intervalMs while few are live, and no more than maxReadingsPerSecond in all when many are', async () => {
    vi.useFakeTimers();
    try {
      const reads = new Map<string, number>();
      const counting = (id: string) => fakeSandbox(id, () => (reads.set(id, (reads.get(id) ?? 0) + 1), {}));
      const few = new UsageSampler({ intervalMs: 1000, maxReadingsPerSecond: 50 });
      for (const id of ['a', 'b']) few.track(counting(id));
      await vi.advanceTimersByTimeAsync(10_050);
      // Every second each, from a second after it was tracked.
      expect([reads.get('a'), reads.get('b')]).toEqual([10, 10]);
      few.close();

      reads.clear();
      const many = new UsageSampler({ intervalMs: 1000, maxReadingsPerSecond: 10 });
      const ids = Array.from({ length: 40 }, (_, i) => `s${i}`);
      for (const id of ids) many.track(counting(id));
      await vi.advanceTimersByTimeAsync(20_000);
      const total = [...reads.values()].reduce((a, b) => a + b, 0);
      expect(total).toBeLessThanOrEqual(10 * 20);
      expect(total).toBeGreaterThanOrEqual(10 * 18); // the budget is used, not wasted
      // Oldest first: every sandbox is read, each as often as the others (4 s apart).
      expect(ids.map((id) => reads.get(id) ?? 0).every((n) => n >= 4 && n <= 5)).toBe(true);
      // An untracked one is read no more.
      many.untrack('s0');
      const before = reads.get('s0');
      await vi.advanceTimersByTimeAsync(10_000);
      expect(reads.get('s0')).toBe(before);
      many.close();
    } finally {
      vi.useRealTimers();
    }
  });
});
