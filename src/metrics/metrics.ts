import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import { ARTIFACT_OUTCOMES, OUTCOMES, type ArtifactOutcome, type CapacityInfo, type ExecResult } from '../wire/index.js';

/** What admission control counts (GET /v1/capacity), as the `resource` label of the capacity gauges. */
export const CAPACITY_RESOURCES = ['sandboxes', 'memory_bytes', 'pids', 'disk_bytes'] as const;

/** Resources whose limit can end work; `egress` comes from the network policy, not a cgroup. */
export const TERMINATION_RESOURCES = ['cpu', 'memory', 'disk', 'wall_clock', 'pids', 'output', 'file_size', 'egress'] as const;
export type TerminationResource = (typeof TERMINATION_RESOURCES)[number];



export interface CreateLabels {
  backend: string;
  /** The template name, or `none`. Templates are operator-defined, so the set stays small. */
  template?: string;
  /** Whether the sandbox came from the warm pool. */
  poolWarm: boolean;
}

export interface CapsuleMetricsOptions {
  /** Backends to pre-declare so their series exist (at 0) before the first event. @default ['namespace'] */
  backends?: readonly string[];
  /** Prepended to every metric name. @default 'capsule_' */
  prefix?: string;
}

/**
 * The operator's view of Capsule, in Prometheus terms. One instance per server owns its own
 * registry (never prom-client's global one). Labels have bounded cardinality: no sandbox ids,
 * no raw URLs — routes are recorded by their pattern.
 */
export class CapsuleMetrics {
  readonly registry = new Registry();
  private readonly createDuration: Histogram<'backend' | 'template' | 'pool_warm'>;
  private readonly limitTerminations: Counter<'resource'>;
  private readonly execs: Counter<'backend' | 'outcome'>;
  private readonly egressBlocked: Counter;
  private readonly artifactDeliveries: Counter<'outcome'>;
  private readonly activeSandboxes: Gauge;
  private readonly execDuration: Histogram<'backend'>;
  private readonly apiRequests: Counter<'route' | 'method' | 'status'>;
  private readonly capacityFree: Gauge<'resource'>;
  private readonly capacityLimit: Gauge<'resource'>;
  private readonly capacityWaiting: Gauge;

  constructor(options: CapsuleMetricsOptions = {}) {
    const prefix = options.prefix ?? 'capsule_';
    const registers = [this.registry];
    this.createDuration = new Histogram({
      name: `${prefix}sandbox_create_duration_seconds`,
      help: 'Time to create a sandbox, from request to running.',
      labelNames: ['backend', 'template', 'pool_warm'],
      buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
      registers,
    });
    this.limitTerminations = new Counter({
      name: `${prefix}limit_terminations_total`,
      help: 'Execs ended by a limit, by the resource whose limit ended them.',
      labelNames: ['resource'],
      registers,
    });
    this.execs = new Counter({
      name: `${prefix}execs_total`,
      help: 'Execs that ended, by backend and outcome (ok, exit_nonzero, limit_exceeded, error).',
      labelNames: ['backend', 'outcome'],
      registers,
    });
    this.egressBlocked = new Counter({
      name: `${prefix}egress_blocked_total`,
      help: 'Outbound connections or requests refused by the network policy.',
      registers,
    });
    this.artifactDeliveries = new Counter({
      name: `${prefix}artifact_deliveries_total`,
      help: 'Files considered for delivery as artifacts, by outcome (ok, too_large, verify_failed, skipped).',
      labelNames: ['outcome'],
      registers,
    });
    this.activeSandboxes = new Gauge({
      name: `${prefix}active_sandboxes`,
      help: 'Sandboxes currently alive (starting, running or paused).',
      registers,
    });
    this.execDuration = new Histogram({
      name: `${prefix}exec_duration_seconds`,
      help: 'Wall-clock duration of execs, by backend.',
      labelNames: ['backend'],
      buckets: [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300],
      registers,
    });
    this.apiRequests = new Counter({
      name: `${prefix}api_requests_total`,
      help: 'HTTP API requests, by route pattern, method and status code.',
      labelNames: ['route', 'method', 'status'],
      registers,
    });
    this.capacityFree = new Gauge({
      name: `${prefix}capacity_free`,
      help: 'What admission control can still promise to new sandboxes, by resource (sandboxes, memory_bytes, pids, disk_bytes).',
      labelNames: ['resource'],
      registers,
    });
    this.capacityLimit = new Gauge({
      name: `${prefix}capacity_limit`,
      help: 'What admission control promises to live sandboxes at most, by resource (the host less reserves, times the overcommit ratio).',
      labelNames: ['resource'],
      registers,
    });
    this.capacityWaiting = new Gauge({
      name: `${prefix}capacity_waiting_creates`,
      help: 'Creates waiting for room (waitForCapacityMs).',
      registers,
    });
    // Declare the series the four operating rates divide by, so a rate is 0, not absent.
    for (const resource of TERMINATION_RESOURCES) this.limitTerminations.inc({ resource }, 0);
    for (const outcome of ARTIFACT_OUTCOMES) this.artifactDeliveries.inc({ outcome }, 0);
    for (const backend of options.backends ?? ['namespace']) {
      for (const outcome of OUTCOMES) this.execs.inc({ backend, outcome }, 0);
    }
    this.egressBlocked.inc(0);
  }

  /** One finished exec: counts it, observes its duration, and counts the limit that ended it. */
  recordExec(result: Pick<ExecResult, 'outcome' | 'durationMs' | 'limit'>, backend: string): void {
    this.execs.inc({ backend, outcome: result.outcome });
    this.execDuration.observe({ backend }, result.durationMs / 1000);
    if (result.outcome === 'limit_exceeded' && result.limit) this.recordLimitTermination(result.limit.resource);
  }

  /** A limit ended work outside `recordExec`, e.g. the egress proxy cut a sandbox off. */
  recordLimitTermination(resource: TerminationResource): void {
    this.limitTerminations.inc({ resource });
  }

  recordCreate(seconds: number, labels: CreateLabels): void {
    this.createDuration.observe(
      { backend: labels.backend, template: labels.template ?? 'none', pool_warm: String(labels.poolWarm) },
      seconds,
    );
  }

  recordArtifact(outcome: ArtifactOutcome): void {
    this.artifactDeliveries.inc({ outcome });
  }

  recordEgressBlocked(count = 1): void {
    this.egressBlocked.inc(count);
  }

  /**
   * One API request. `route` is the route pattern (`/v1/sandboxes/:id`), never the URL: a URL
   * carries ids and would make one series per sandbox. Unmatched requests use `unmatched`.
   */
  recordRequest(route: string, method: string, status: number): void {
    this.apiRequests.inc({ route, method: method.toUpperCase(), status: String(status) });
  }

  setActive(count: number): void {
    this.activeSandboxes.set(count);
  }

  /** The server's capacity now (read at scrape time). */
  setCapacity(info: Omit<CapacityInfo, 'tenant'>): void {
    const figures: Record<(typeof CAPACITY_RESOURCES)[number], { free: number; limit: number }> = {
      sandboxes: { free: info.sandboxes.free, limit: info.sandboxes.limit },
      memory_bytes: { free: info.memory.freeBytes, limit: info.memory.limitBytes },
      pids: { free: info.pids.free, limit: info.pids.limit },
      disk_bytes: { free: info.disk.freeBytes, limit: info.disk.limitBytes },
    };
    for (const resource of CAPACITY_RESOURCES) {
      this.capacityFree.set({ resource }, figures[resource].free);
      this.capacityLimit.set({ resource }, figures[resource].limit);
    }
    this.capacityWaiting.set(info.waiting);
  }

  /** The Prometheus text exposition of every metric. */
  render(): Promise<string> {
    return this.registry.metrics();
  }

  get contentType(): string {
    return this.registry.contentType;
  }
}
