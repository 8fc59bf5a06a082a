import type { BackendSandbox } from '../backends/backend.js';
import type { UsageSample } from '../wire/index.js';

export interface UsageSamplerOptions {
  /** @default 5000 */
  intervalMs?: number;
  /** Samples kept per sandbox (the oldest go first). @default 120 (10 minutes at 5 s) */
  capacity?: number;
  /** Ended sandboxes whose samples are still answered. @default 100 */
  keepEnded?: number;
  now?: () => number;
}

interface Series {
  sandbox: BackendSandbox | undefined;
  samples: UsageSample[];
  timer: NodeJS.Timeout | undefined;
  last: { atMs: number; cpuUsec: number };
  reading: Promise<UsageSample | undefined> | undefined;
}

/**
 * Per-sandbox usage over time: reads the backend's counters every `intervalMs` for each tracked
 * (live) sandbox into a bounded ring, and once more on demand. Timers are unref'd; `untrack`
 * stops a sandbox's timer and keeps its samples for a while (bounded by `keepEnded`).
 */
export class UsageSampler {
  private readonly series = new Map<string, Series>();
  private readonly ended: string[] = [];
  private readonly intervalMs: number;
  private readonly capacity: number;
  private readonly keepEnded: number;
  private readonly now: () => number;

  constructor(options: UsageSamplerOptions = {}) {
    this.intervalMs = options.intervalMs ?? 5000;
    this.capacity = Math.max(1, options.capacity ?? 120);
    this.keepEnded = options.keepEnded ?? 100;
    this.now = options.now ?? Date.now;
  }

  /** Starts sampling a live sandbox; `startedAtMs` anchors the first CPU share. */
  track(sandbox: BackendSandbox, startedAtMs: number = this.now()): void {
    this.untrack(sandbox.id, { keep: false });
    const series: Series = { sandbox, samples: [], timer: undefined, last: { atMs: startedAtMs, cpuUsec: 0 }, reading: undefined };
    series.timer = setInterval(() => void this.read(series), this.intervalMs);
    series.timer.unref();
    this.series.set(sandbox.id, series);
  }

  /** Stops sampling; the samples stay readable unless `keep` is false. */
  untrack(sandboxId: string, options: { keep?: boolean } = {}): void {
    const series = this.series.get(sandboxId);
    if (!series) return;
    clearInterval(series.timer);
    series.timer = undefined;
    series.sandbox = undefined;
    if (options.keep === false) {
      this.series.delete(sandboxId);
      return;
    }
    this.ended.push(sandboxId);
    while (this.ended.length > this.keepEnded) this.series.delete(this.ended.shift()!);
  }

  /**
   * The kept samples, oldest first, plus a fresh one when the sandbox is live. `live` starts
   * tracking a running sandbox not tracked yet (one recovered after a restart).
   */
  async samples(sandboxId: string, live?: BackendSandbox): Promise<UsageSample[]> {
    if (live && !this.series.get(sandboxId)?.sandbox) this.track(live);
    const series = this.series.get(sandboxId);
    if (!series) return [];
    if (series.sandbox) await this.read(series);
    return [...series.samples];
  }

  close(): void {
    for (const id of [...this.series.keys()]) this.untrack(id, { keep: false });
  }

  /** One reading; a concurrent caller shares it. A sandbox that ended meanwhile gives none. */
  private read(series: Series): Promise<UsageSample | undefined> {
    const sandbox = series.sandbox;
    if (!sandbox) return Promise.resolve(undefined);
    series.reading ??= (async () => {
      try {
        const [counters, disk] = await Promise.all([sandbox.counters(), sandbox.diskUsedBytes()]);
        const atMs = this.now();
        const cpus = sandbox.spec.limits.cpus;
        const shareMs = (counters.cpuUsageUsec - series.last.cpuUsec) / 1000;
        const pct = (shareMs / Math.max(1, atMs - series.last.atMs) / cpus) * 100;
        series.last = { atMs, cpuUsec: counters.cpuUsageUsec };
        const sample: UsageSample = {
          timestamp: new Date(atMs).toISOString(),
          cpuUsedPct: Math.round(Math.min(100, Math.max(0, pct)) * 100) / 100,
          cpuTimeMs: Math.round(counters.cpuUsageUsec / 1000),
          memoryBytes: counters.memoryUsageBytes,
          memoryPeakBytes: counters.memoryPeakBytes,
          diskBytes: disk ?? null,
        };
        series.samples.push(sample);
        if (series.samples.length > this.capacity) series.samples.splice(0, series.samples.length - this.capacity);
        return sample;
      } catch {
        // The sandbox ended between the timer and the read (its cgroup is gone): no sample.
        return undefined;
      } finally {
        series.reading = undefined;
      }
    })();
    return series.reading;
  }
}
