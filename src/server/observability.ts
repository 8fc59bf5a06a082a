import { join } from 'node:path';
import type { EngineEvent, ProcessObserver } from '../engine/events.js';
import { CapsuleMetrics } from '../metrics/metrics.js';
import { LocalArtifactStore } from '../store/artifacts/index.js';
import type { SandboxRecordStore } from '../store/index.js';
import { ProcessLogs } from './process-logs.js';
import type { ServerServices } from './services.js';

export interface ObservabilityOptions {
  dataDir: string;
  records: SandboxRecordStore;
  /** How often expired artifacts and old output logs are swept. @default 10 minutes */
  sweepIntervalMs?: number;
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

  private constructor(
    readonly artifacts: LocalArtifactStore,
    dataDir: string,
  ) {
    this.processLogs = new ProcessLogs(dataDir);
  }

  /** Opens the artifact store and drops the output logs of sandboxes a previous run ended. */
  static async open(options: ObservabilityOptions): Promise<Observability> {
    const store = await LocalArtifactStore.open({ root: join(options.dataDir, 'artifacts') });
    const observability = new Observability(store, options.dataDir);
    await observability.processLogs.removeAllExcept(new Set(options.records.listLive().map((r) => r.sandboxId)));
    observability.sweepTimer = setInterval(() => void observability.sweep(), options.sweepIntervalMs ?? 10 * 60 * 1000);
    observability.sweepTimer.unref();
    return observability;
  }

  get services(): Pick<ServerServices, 'metrics' | 'artifacts' | 'processLogs'> {
    return { metrics: this.metrics, artifacts: this.artifacts, processLogs: this.processLogs };
  }

  /** For SandboxManagerOptions.processObserver. */
  readonly processObserver: ProcessObserver = {
    onProcessStart: (process) => this.processLogs.started(process),
    onProcessOutput: (process, stream, data) => this.processLogs.output(process, stream, data),
    onExecResult: (process, result) => {
      this.metrics.recordExec(result, process.backend);
      this.processLogs.ended(process);
    },
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
      case 'sandbox.recovered':
        break;
      default:
        this.processLogs.sandboxEnded(sandbox.sandboxId);
    }
  }

  /** Removes expired artifacts and the output logs whose retention ended. */
  sweep(): Promise<void> {
    this.sweeping ??= (async () => {
      try {
        await this.artifacts.sweepExpired();
        await this.processLogs.sweep();
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
    await this.processLogs.close();
    await this.artifacts.close();
  }
}
