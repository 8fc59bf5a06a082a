import { randomUUID } from 'node:crypto';
import { isSandboxError, SandboxError } from '../errors/index.js';
import { BuildLog, type OnLog } from './build-log.js';
import { ownerTag } from './owner.js';
import type { BuildRecord } from './records.js';
import type { TemplateStore } from './template-store.js';

const SAVE_EVERY_MS = 1000;

/**
 * One build (a bootstrap, an import or a Dockerfile build) while it runs: its log streams to the
 * caller's `onLog` and is kept (bounded) in a build record that is saved when the build starts,
 * at most once a second while it logs (so another process can follow it), and when it ends.
 */
export class BuildSession {
  readonly id = randomUUID();
  readonly log: BuildLog;
  readonly record: BuildRecord;
  private lastSave = 0;
  private saving: Promise<void> = Promise.resolve();

  constructor(
    private readonly store: TemplateStore,
    owner: string,
    target: string,
    onLog?: OnLog,
  ) {
    this.record = { id: this.id, owner, target, status: 'building', startedAt: new Date().toISOString(), steps: [], log: [], logDropped: 0 };
    this.log = new BuildLog({
      onLog: (entry) => {
        onLog?.(entry);
        if (Date.now() - this.lastSave >= SAVE_EVERY_MS) this.save();
      },
    });
  }

  async start(): Promise<void> {
    this.save();
    await this.saving;
  }

  private save(): void {
    this.lastSave = Date.now();
    const snapshot: BuildRecord = { ...this.record, log: this.log.entries(), logDropped: this.log.dropped };
    this.saving = this.saving.then(() => this.store.saveBuild(snapshot, ownerTag()).catch(() => undefined));
  }

  /** Records success. */
  async succeed(templateId: string): Promise<void> {
    Object.assign(this.record, { status: 'ready', templateId, finishedAt: new Date().toISOString() });
    this.save();
    await this.saving;
  }

  /** Records the failure (logged as the last entry) and returns the error to throw. */
  async fail(error: unknown): Promise<SandboxError> {
    const failure = isSandboxError(error) ? error : new SandboxError('INTERNAL', `the build failed: ${(error as Error).message ?? String(error)}`, { cause: error });
    const step = typeof failure.details?.step === 'string' ? failure.details.step : undefined;
    this.log.write('error', step ?? 'finalize', failure.message);
    this.record.status = 'error';
    this.record.finishedAt = new Date().toISOString();
    this.record.error = { code: failure.code, message: failure.message, ...(step === undefined ? {} : { step }), ...(failure.details ? { details: failure.details } : {}) };
    this.save();
    await this.saving;
    return failure;
  }
}
