import { join } from 'node:path';
import type { EngineEvent, ProcessObserver } from '../engine/sandbox-manager.js';
import type { SandboxEngine } from '../engine/types.js';
import { UsageSampler } from '../engine/usage-sampler.js';
import type { BackendSandbox } from '../backends/backend.js';
import { CapsuleMetrics } from '../metrics/metrics.js';
import { LocalArtifactStore } from '../store/artifacts/index.js';
import type { SandboxRecordStore } from '../engine/sandbox-manager.js';
import { ProcessLogs } from '../engine/process-logs.js';
import type { TenantDiskQuota } from './disk-quota.js';
import type { ServerServices } from './services.js';

export interface ObservabilityOptions {
  dataDir: string;
  records: SandboxRecordStore;
  /** How often expired artifacts and old output logs are swept. @default 10 minutes */
  sweepIntervalMs?: number;
  /** Each tenant's disk quota: process logs and artifacts are charged to it. */
  diskQuota?: TenantDiskQuota;
}

/**
 * What the server records beside the engine's own work: Prometheus metrics, per-sandbox usage
 * samples, process output logs and the artifact store. Fed by the engine's event and process
 * hooks (the one place they are recorded); `close()` stops the timers and closes the store.
 */
export class Observability {
  readonly metrics = new CapsuleMetrics();
  readonly usage = new UsageSampler();
  readonly processLogs: ProcessLogs;
  private engine: SandboxEngine | undefined;
  private sweepTimer: NodeJS.Timeout | undefined;
  private sweeping: Promise<void> | undefined;

  private readonly diskQuota: TenantDiskQuota | undefined;

  private constructor(
    readonly artifacts: LocalArtifactStore,
    options: ObservabilityOptions,
  ) {
    this.diskQuota = options.diskQuota;
    this.processLogs = new ProcessLogs({ dataDir: options.dataDir, budget: options.diskQuota });
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
    observability.sweepTimer = setInterval(() => void observability.sweep(), options.sweepIntervalMs ?? 10 * 60 * 1000);
    observability.sweepTimer.unref();
    return observability;
  }

  get services(): Pick<ServerServices, 'metrics' | 'artifacts' | 'usage' | 'processLogs' | 'diskQuota'> {
    return { metrics: this.metrics, artifacts: this.artifacts, usage: this.usage, processLogs: this.processLogs, diskQuota: this.diskQuota };
  }

  /** For SandboxManagerOptions.processObserver. */
  readonly processObserver: ProcessObserver = {
    onExecResult: (process, result) => this.metrics.recordExec(result, process.backend),
  };

  /** The engine whose live sandboxes are sampled (set once it is open). */
  attach(engine: SandboxEngine): void {
    this.engine = engine;
  }

  /** For SandboxManagerOptions.onEvent. */
  onEvent(event: EngineEvent): void {
    const { sandbox } = event;
    switch (event.type) {
      case 'sandbox.created':
        // createdAt is when the engine accepted the request; the event fires once it is running.
        this.metrics.recordCreate((Date.now() - Date.parse(sandbox.createdAt)) / 1000, { backend: sandbox.backend, template: 'base', poolWarm: event.poolWarm === true });
        this.track(sandbox.tenantId, sandbox.sandboxId, Date.parse(sandbox.createdAt));
        break;
      case 'sandbox.recovered':
        this.track(sandbox.tenantId, sandbox.sandboxId, Date.now());
        break;
      default:
        this.usage.untrack(sandbox.sandboxId);
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
    this.usage.close();
    await this.sweeping;
    await this.processLogs.flushed();
    await this.artifacts.close();
  }

  private track(tenantId: string, sandboxId: string, startedAtMs: number): void {
    const engine = this.engine as { backendSandbox?(tenantId: string, sandboxId: string): BackendSandbox } | undefined;
    try {
      const sandbox = engine?.backendSandbox?.(tenantId, sandboxId);
      if (sandbox) this.usage.track(sandbox, startedAtMs);
    } catch {
      // Not running (a sandbox recovered paused): sampled from its next create or recovery.
    }
  }
}
