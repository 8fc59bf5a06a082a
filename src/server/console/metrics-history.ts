import type { Registry } from 'prom-client';
import type { CreatePercentiles, MetricsSample } from '../../wire/index.js';

export interface MetricsHistoryOptions {
  /** @default 10000 */
  intervalMs?: number;
  /** Samples kept (the oldest go first). @default 360 (an hour at 10 s) */
  capacity?: number;
  /** The window create percentiles are computed over. @default 300000 (5 minutes) */
  windowMs?: number;
  /** Prefix of the metric names. @default 'capsule_' */
  prefix?: string;
  now?: () => number;
}

/** Cumulative create-duration buckets per label set: `le` → count. */
type Buckets = Map<string, { labels: Omit<CreatePercentiles, 'count' | 'p50' | 'p95' | 'p99'>; counts: Map<number, number> }>;

interface Entry {
  atMs: number;
  sample: Omit<MetricsSample, 'creates'>;
  buckets: Buckets;
}

interface JsonValue {
  value: number;
  metricName?: string;
  labels: Record<string, string | number>;
}

/**
 * A bounded history of the four operating metrics, read from the server's Prometheus registry
 * every `intervalMs`: counters as they stand (a client charts their rate) and create-duration
 * percentiles over a sliding window, estimated from the histogram's buckets like PromQL's
 * histogram_quantile.
 */
export class MetricsHistory {
  private readonly entries: Entry[] = [];
  private readonly timer: NodeJS.Timeout;
  readonly intervalMs: number;
  readonly windowMs: number;
  private readonly capacity: number;
  private readonly prefix: string;
  private readonly now: () => number;

  constructor(
    private readonly registry: Registry,
    options: MetricsHistoryOptions = {},
  ) {
    this.intervalMs = options.intervalMs ?? 10_000;
    this.capacity = Math.max(2, options.capacity ?? 360);
    this.windowMs = options.windowMs ?? 300_000;
    this.prefix = options.prefix ?? 'capsule_';
    this.now = options.now ?? Date.now;
    this.timer = setInterval(() => void this.take().catch(() => undefined), this.intervalMs);
    this.timer.unref();
  }

  /** The kept samples, oldest first, plus one taken now. */
  async samples(): Promise<MetricsSample[]> {
    const now = await this.read();
    return [...this.entries, now].map((entry) => ({ ...entry.sample, creates: this.percentiles(entry) }));
  }

  close(): void {
    clearInterval(this.timer);
  }

  async take(): Promise<void> {
    this.entries.push(await this.read());
    if (this.entries.length > this.capacity) this.entries.splice(0, this.entries.length - this.capacity);
  }

  private async read(): Promise<Entry> {
    const metrics = await this.registry.getMetricsAsJSON();
    const values = (name: string): JsonValue[] => (metrics.find((m) => m.name === `${this.prefix}${name}`)?.values ?? []) as JsonValue[];
    const byLabel = (name: string, label: string): Record<string, number> => {
      const out: Record<string, number> = {};
      for (const v of values(name)) {
        const key = String(v.labels[label] ?? '');
        out[key] = (out[key] ?? 0) + v.value;
      }
      return out;
    };
    const buckets: Buckets = new Map();
    for (const v of values('sandbox_create_duration_seconds')) {
      if (!v.metricName?.endsWith('_bucket')) continue;
      const { le, backend, template, pool_warm: poolWarm } = v.labels;
      const key = `${String(backend)}|${String(template)}|${String(poolWarm)}`;
      let series = buckets.get(key);
      if (!series) {
        series = { labels: { backend: String(backend), template: String(template), poolWarm: poolWarm === 'true' }, counts: new Map() };
        buckets.set(key, series);
      }
      series.counts.set(le === '+Inf' ? Infinity : Number(le), v.value);
    }
    const atMs = this.now();
    return {
      atMs,
      buckets,
      sample: {
        timestamp: new Date(atMs).toISOString(),
        limitTerminations: byLabel('limit_terminations_total', 'resource'),
        egressBlocked: values('egress_blocked_total').reduce((sum, v) => sum + v.value, 0),
        artifactDeliveries: byLabel('artifact_deliveries_total', 'outcome'),
        execs: byLabel('execs_total', 'outcome'),
        activeSandboxes: values('active_sandboxes').reduce((sum, v) => sum + v.value, 0),
      },
    };
  }

  /** Percentiles over the creates between the oldest entry inside the window and `entry`. */
  private percentiles(entry: Entry): CreatePercentiles[] {
    const base = this.entries.find((e) => e.atMs >= entry.atMs - this.windowMs && e.atMs < entry.atMs);
    return [...entry.buckets.entries()].map(([key, series]) => {
      const before = base?.buckets.get(key)?.counts;
      const window = [...series.counts.entries()].sort((a, b) => a[0] - b[0]).map(([le, count]) => [le, count - (before?.get(le) ?? 0)] as const);
      const count = window.at(-1)?.[1] ?? 0;
      return { ...series.labels, count, p50: quantile(window, 0.5), p95: quantile(window, 0.95), p99: quantile(window, 0.99) };
    });
  }
}

/**
 * The q-quantile of cumulative buckets (upper bound → count), interpolated linearly inside the
 * bucket it falls in; in the +Inf bucket, the largest finite bound. Null without observations.
 */
export function quantile(buckets: readonly (readonly [number, number])[], q: number): number | null {
  const total = buckets.at(-1)?.[1] ?? 0;
  if (total <= 0) return null;
  const rank = q * total;
  let lowerBound = 0;
  let lowerCount = 0;
  for (const [le, count] of buckets) {
    if (count >= rank) {
      if (le === Infinity) return lowerBound;
      const inBucket = count - lowerCount;
      return inBucket <= 0 ? le : lowerBound + ((le - lowerBound) * (rank - lowerCount)) / inBucket;
    }
    lowerBound = le;
    lowerCount = count;
  }
  return lowerBound;
}
