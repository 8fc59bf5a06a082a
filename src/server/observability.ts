import { join } from 'node:path';
import type { EngineEvent, ProcessObserver } from '../engine/events.js';
import { CapsuleMetrics } from '../metrics/metrics.js';
import { LocalArtifactStore } from '../store/artifacts/index.js';
import type { SandboxRecordStore } from '../store/index.js';
import { ProcessLogs } from '../engine/process-logs.js';
import type { TenantDiskQuota } from './disk-quota.js';
import type { ServerServices } from './services.js';

export interface ObservabilityOptions {
  dataDir: string;
  records: SandboxRecordStore;
  /**
   * How often expired artifacts and old output logs are swept. @default 10 minutes, or a quarter
   * of a shorter log retention (at least 1 s)
   */
  sweepIntervalMs?: number;
  /** How long an ended sandbox's output logs are kept. @default 1 hour (ProcessLogs) */
  processLogRetentionMs?: number;
  /** Each tenant's disk quota: process logs and artifacts are charged to it. */
  diskQuota?: TenantDiskQuota;
}

/**
 * What the server records beside the engine's own work: Prometheus metrics, process output logs
 * and the artifact store. Fed by the engine's event and process
 * hooks (the one place they are recorded); `close()` stops the timers and closes the store.
 */
export class Observability {
  readonly metrics = new CapsuleMetrics();
  readonly processLogs: ProcessLogs;
  private sweepTimer: NodeJS.Timeout | undefined;
  private sweeping: Promise<void> | undefined;

  private readonly diskQuota: TenantDiskQuota | undefined;

  private constructor(
    readonly artifacts: LocalArtifactStore,
    options: ObservabilityOptions,
  ) {
    this.diskQuota = options.diskQuota;
    this.processLogs = new ProcessLogs({ dataDir: options.dataDir, budget: options.diskQuota, retentionMs: options.processLogRetentionMs });
  }

  /**
   * Opens the artifact store and drops the output logs of sandboxes a previous run ended (the
   * logs of live ones are charged to their tenants again).
   */
  static async open(options: ObservabilityOptions): Promise<Observability> {
    const store = await LocalArtifactStore.open({ root: join(options.dataDir, 'artifacts') });
    const observability = new Observability(store, options);
    await observability.processLogs.reconcile(options.records.listLive());
    options.diskQuota?.setStoredArtifacts(await store.bytesByTenant());
    observability.sweepTimer = setInterval(() => void observability.sweep(), options.sweepIntervalMs ?? sweepIntervalFor(options.processLogRetentionMs));
    observability.sweepTimer.unref();
    return observability;
  }

  get services(): Pick<ServerServices, 'metrics' | 'artifacts' | 'processLogs' | 'diskQuota'> {
    return { metrics: this.metrics, artifacts: this.artifacts, processLogs: this.processLogs, diskQuota: this.diskQuota };
  }

  /** For SandboxManagerOptions.processObserver. */
  readonly processObserver: ProcessObserver = {
    onExecResult: (process, result) => this.metrics.recordExec(result, process.backend),
    onArtifact: (outcome) => this.metrics.recordArtifact(outcome),
  };

  /** For SandboxManagerOptions.onEvent. */
  onEvent(event: EngineEvent): void {
    const { sandbox } = event;
    switch (event.type) {
      case 'sandbox.created':
        // createdAt is when the engine accepted the request; the event fires once it is running.
        this.metrics.recordCreate((Date.now() - Date.parse(sandbox.createdAt)) / 1000, { backend: sandbox.backend, template: sandbox.spec.template ?? 'host', poolWarm: event.poolWarm === true });
        break;
      default:
        break;
    }
  }

  /** Removes expired artifacts and the output logs whose retention ended. */
  sweep(): Promise<void> {
    this.sweeping ??= (async () => {
      try {
        await this.artifacts.sweepExpired();
        await this.processLogs.sweep();
        // Expired artifacts no longer count; the running totals are set from the store again.
        this.diskQuota?.setStoredArtifacts(await this.artifacts.bytesByTenant());
      } catch (error) {
        process.stderr.write(`capsule: sweeping artifacts and logs failed: ${(error as Error).message}\n`);
      } finally {
        this.sweeping = undefined;
      }
    })();
    return this.sweeping;
  }

  /** After the engine closed: timers stop, logs are flushed, the store is closed. */
  async close(): Promise<void> {
    clearInterval(this.sweepTimer);
    await this.sweeping;
    await this.processLogs.flushed();
    await this.artifacts.close();
  }
}

/** The sweep's period: 10 minutes, or often enough that a shorter log retention is kept to within a quarter of itself. */
function sweepIntervalFor(retentionMs: number | undefined): number {
  const tenMinutes = 10 * 60 * 1000;
  return retentionMs === undefined ? tenMinutes : Math.min(tenMinutes, Math.max(1000, Math.floor(retentionMs / 4)));
}
