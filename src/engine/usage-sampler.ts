import type { BackendSandbox } from '../backends/backend.js';
import type { UsageSample } from '../wire/index.js';

export interface UsageSamplerOptions {
  /** How often each sandbox is read while few are live. @default 5000 */
  intervalMs?: number;
  /**
   * Readings per second over all sandboxes, at most: past `maxReadingsPerSecond × intervalMs`
   * live sandboxes each is read less often (1,000 live at the defaults: every 20 s), so that the
   * sampler's share of the server stays flat as sandboxes are added. @default 50
   */
  maxReadingsPerSecond?: number;
  /** Samples kept per sandbox (the oldest go first). @default 120 (10 minutes at 5 s) */
  capacity?: number;
  /** Ended sandboxes whose samples are still answered. @default 100 */
  keepEnded?: number;
  now?: () => number;
}

interface Series {
  sandbox: BackendSandbox | undefined;
  samples: UsageSample[];
  last: { atMs: number; cpuUsec: number };
  /** When the scheduler read it last (or it was tracked), on the timer's clock. */
  scheduledAtMs: number;
  reading: Promise<UsageSample | undefined> | undefined;
}

/** How often the scheduler looks for sandboxes due a reading. */
const TICK_MS = 100;

/**
 * Per-sandbox usage over time: reads the backend's counters every `intervalMs` for each tracked
 * (live) sandbox into a bounded ring, and once more on demand. One unref'd timer serves them
 * all, oldest reading first and at most `maxReadingsPerSecond`; `untrack` stops a sandbox's
 * readings and keeps its samples for a while (bounded by `keepEnded`).
 */
export class UsageSampler {
  private readonly series = new Map<string, Series>();
  private readonly ended: string[] = [];
  /** Live series, least recently read first (each is read at the same interval, so a queue). */
  private due: Series[] = [];
  private timer: NodeJS.Timeout | undefined;
  private readonly intervalMs: number;
  private readonly perTick: number;
  private readonly capacity: number;
  private readonly keepEnded: number;
  private readonly now: () => number;

  constructor(options: UsageSamplerOptions = {}) {
    this.intervalMs = options.intervalMs ?? 5000;
    this.perTick = Math.max(1, Math.round(((options.maxReadingsPerSecond ?? 50) * TICK_MS) / 1000));
    this.capacity = Math.max(1, options.capacity ?? 120);
    this.keepEnded = options.keepEnded ?? 100;
    this.now = options.now ?? Date.now;
  }

  /** Starts sampling a live sandbox; `startedAtMs` anchors the first CPU share. */
  track(sandbox: BackendSandbox, startedAtMs: number = this.now()): void {
    this.untrack(sandbox.id, { keep: false });
    const series: Series = { sandbox, samples: [], last: { atMs: startedAtMs, cpuUsec: 0 }, scheduledAtMs: Date.now(), reading: undefined };
    this.series.set(sandbox.id, series);
    this.due.push(series);
    if (!this.timer) {
      this.timer = setInterval(() => this.tick(), TICK_MS);
      this.timer.unref();
    }
  }

  /** Reads the sandboxes due, oldest first, up to the budget of one tick. */
  private tick(): void {
    const now = Date.now();
    let read = 0;
    while (read < this.perTick && this.due.length > 0) {
      const series = this.due[0]!;
      if (now - series.scheduledAtMs < this.intervalMs) break;
      this.due.shift();
      series.scheduledAtMs = now;
      this.due.push(series);
      void this.read(series);
      read++;
    }
    if (this.due.length === 0) {
      clearInterval(this.timer);
      this.timer = undefined;
    }
  }

  /** Stops sampling; the samples stay readable unless `keep` is false. */
  untrack(sandboxId: string, options: { keep?: boolean } = {}): void {
    const series = this.series.get(sandboxId);
    if (!series) return;
    series.sandbox = undefined;
    const queued = this.due.indexOf(series);
    if (queued !== -1) this.due.splice(queued, 1);
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
    this.due = [];
    clearInterval(this.timer);
    this.timer = undefined;
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
