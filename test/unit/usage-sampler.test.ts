import { describe, expect, it } from 'vitest';
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
