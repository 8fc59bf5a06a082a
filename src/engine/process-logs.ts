import { readFileSync } from 'node:fs';
import { mkdir, readdir, rm, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { DEFAULT_OUTPUT_LOG_BYTES, logRecordBytes, outputLogDir, outputLogPath, removeOutputLogs } from './output-log.js';
import type { EndedProcessRecord } from './managed-process.js';
import { ProcessOutput, type LogBudget } from './process-output.js';

/** Whose logs: disk is charged to the tenant (under its creating key's quota), per sandbox. */
export interface LogOwner {
  tenantId: string;
  sandboxId: string;
  /** The disk quota the sandbox was created under. @default the operator's */
  quotaBytes?: number;
}

/**
 * Where process logs take their disk from (the server: each tenant's disk quota). Bytes are file
 * bytes. `reserve` may refuse with QUOTA_EXCEEDED; `restore` charges logs found at start-up.
 */
export interface LogDiskBudget {
  /** Room for the kept output of a process about to start; throws to refuse the process. */
  reserve(owner: LogOwner, bytes: number): void;
  take(owner: LogOwner, bytes: number): boolean;
  release(owner: LogOwner, bytes: number): void;
  restore(owner: LogOwner, bytes: number): void;
}

export interface ProcessLogsOptions {
  dataDir: string;
  /** Room in each log for output past the caps. @default 64 MiB */
  extraBytes?: number;
  /** How long the logs of an ended sandbox are kept. @default 1 hour */
  retentionMs?: number;
  budget?: LogDiskBudget;
  now?: () => number;
}

/** Beside an ended sandbox's logs: the records of its processes (ProcessLogs.writeEnded). */
const ENDED_PROCESSES_FILE = 'processes.json';

/** A sandbox whose logs a sweep could not remove is due again this much later (the next sweep after that tries). */
const SWEEP_RETRY_MS = 60 * 1000;

/** Slack over the caps for the per-record headers (16 bytes per chunk of up to 64 KiB). */
const RESERVE_SLACK_BYTES = 64 * 1024;

/**
 * What one sandbox's logs hold on disk, kept from its first closed log until the sweep removes
 * them (an hour after it ended, by default). A class, not the caller's owner object: one fixed
 * shape per entry; the owners come as spreads (`{ ...owner, pid }`), and keeping one gave every
 * entry a hidden class of its own (~0.3 KiB each in a heap snapshot diff of a soak).
 */
class HeldLogs implements LogOwner {
  constructor(
    readonly tenantId: string,
    readonly sandboxId: string,
    readonly quotaBytes: number | undefined,
    public bytes: number,
  ) {}
}

/**
 * The output logs of every process (`<dataDir>/logs/<sandboxId>/<pid>.output`): opens each
 * process's log (charging its disk to the tenant), keeps a sandbox's logs for `retentionMs` after
 * it ended, and removes them in `sweep()`. A log that cannot be written is counted in
 * `failures` and reported on stderr, never silently dropped.
 */
export class ProcessLogs {
  readonly dataDir: string;
  failures = 0;
  /** Bytes on disk per sandbox, for the budget when its logs go (kept for the retention: small). */
  private readonly held = new Map<string, HeldLogs>();
  private readonly dirs = new Map<string, Promise<void>>();
  private readonly removals = new Map<string, number>();
  private readonly pending = new Set<Promise<unknown>>();
  /** Logs opened and not closed yet, per sandbox. */
  private readonly openLogs = new Map<string, number>();
  /**
   * Sandboxes whose logs were removed while some were still open (a process that outlived its
   * sandbox's retention: a paused gVisor sandbox's handed-over one): each such log is deleted and
   * uncharged when it closes, instead of being held with nothing left to remove it.
   */
  private readonly orphans = new Set<string>();
  private readonly now: () => number;
  /** Told when a sandbox's logs were removed (the engine forgets its ended processes then). */
  onRemoved: (sandboxId: string) => void = () => undefined;

  constructor(private readonly options: ProcessLogsOptions) {
    this.dataDir = options.dataDir;
    this.now = options.now ?? Date.now;
  }

  /** Log bytes reserved for a process's output within `caps`. */
  static reservationFor(caps: { stdoutBytes: number; stderrBytes: number }): number {
    return logRecordBytes(caps.stdoutBytes) + logRecordBytes(caps.stderrBytes) + RESERVE_SLACK_BYTES;
  }

  /**
   * Reserves the room for a process's kept output, or throws (QUOTA_EXCEEDED from the budget).
   * Returns the bytes reserved; pass them to `open`.
   */
  reserve(owner: LogOwner, caps: { stdoutBytes: number; stderrBytes: number }): number {
    const bytes = ProcessLogs.reservationFor(caps);
    this.options.budget?.reserve(owner, bytes);
    return bytes;
  }

  /** Gives back a reservation that no log was opened with (the process did not start). */
  unreserve(owner: LogOwner, bytes: number): void {
    this.options.budget?.release(owner, bytes);
  }

  /** The log of a process; `reservedBytes` from `reserve` (0 when the process could not be refused). */
  open(owner: LogOwner & { pid: number }, reservedBytes: number, onPressure?: (high: boolean) => void): ProcessOutput {
    const { budget } = this.options;
    const perLog: LogBudget | undefined = budget && { take: (bytes) => budget.take(owner, bytes), release: (bytes) => budget.release(owner, bytes) };
    this.openLogs.set(owner.sandboxId, (this.openLogs.get(owner.sandboxId) ?? 0) + 1);
    return new ProcessOutput({
      path: this.pathOf(owner.sandboxId, owner.pid),
      ensureDir: () => this.ensureDir(owner.sandboxId),
      reservedBytes,
      extraBytes: this.options.extraBytes ?? DEFAULT_OUTPUT_LOG_BYTES,
      budget: perLog,
      now: this.now,
      onPressure,
    });
  }

  /** The process ended: its log is written and closed in the background; its bytes stay charged. */
  closed(owner: LogOwner & { pid: number }, output: ProcessOutput): void {
    this.track(
      output.close().then(
        ({ bytes }) => this.settleClosed(owner, bytes),
        (error: unknown) => {
          this.fail(owner, error);
          return this.settleClosed(owner, output.bytesOnDisk);
        },
      ),
    );
  }

  /** A closed log's bytes stay charged while its sandbox's logs are kept; an orphan's go now. */
  private async settleClosed(owner: LogOwner & { pid: number }, bytes: number): Promise<void> {
    const open = (this.openLogs.get(owner.sandboxId) ?? 1) - 1;
    if (open > 0) this.openLogs.set(owner.sandboxId, open);
    else this.openLogs.delete(owner.sandboxId);
    if (!this.orphans.has(owner.sandboxId)) return this.hold(owner, bytes);
    this.options.budget?.release(owner, bytes);
    if (open > 0) {
      await rm(this.pathOf(owner.sandboxId, owner.pid), { force: true }).catch((error: unknown) => this.fail(owner, error));
      return;
    }
    // The last one: whatever its writes made again of the sandbox's folder goes with it.
    this.orphans.delete(owner.sandboxId);
    this.dirs.delete(owner.sandboxId);
    await removeOutputLogs(this.dataDir, owner.sandboxId).catch((error: unknown) => this.fail(owner, error));
  }

  /** The sandbox ended: its logs are removed by the sweep after the retention. */
  sandboxEnded(sandboxId: string): void {
    this.removals.set(sandboxId, this.now() + (this.options.retentionMs ?? 60 * 60 * 1000));
  }

  /** The log file of a process. */
  pathOf(sandboxId: string, pid: number): string {
    return outputLogPath({ dataDir: this.dataDir, sandboxId, pid });
  }

  /**
   * Writes the records of an ended sandbox's processes beside their logs (charged to its tenant
   * like them), so that the engine can let go of them and read them back on demand. False when
   * the quota has no room or the write failed: the caller keeps them in memory then.
   */
  writeEnded(owner: LogOwner, records: readonly EndedProcessRecord[]): Promise<boolean> {
    // Its logs already removed (the sweep came first): nothing to keep them beside.
    if (!this.keepsEnded(owner.sandboxId)) return Promise.resolve(false);
    if (records.length === 0) return Promise.resolve(true); // no file: `readEnded` reads none as none
    // Tracked: a removal of the sandbox's logs waits for it (flushed), so it writes into no removed directory.
    const written = this.writeEndedFile(owner, records);
    this.track(written);
    return written;
  }

  private async writeEndedFile(owner: LogOwner, records: readonly EndedProcessRecord[]): Promise<boolean> {
    const text = JSON.stringify(records);
    const bytes = Buffer.byteLength(text);
    const { budget } = this.options;
    if (budget && !budget.take(owner, bytes)) return false;
    try {
      await this.ensureDir(owner.sandboxId);
      await writeFile(join(outputLogDir(this.dataDir, owner.sandboxId), ENDED_PROCESSES_FILE), text, { mode: 0o600 });
    } catch (error) {
      budget?.release(owner, bytes);
      this.fail(owner, error);
      return false;
    } finally {
      // Its logs are closed: nothing more is written in its directory (a later ensureDir makes it again).
      this.dirs.delete(owner.sandboxId);
    }
    this.hold(owner, bytes);
    return true;
  }

  /** Whether the logs of the ended sandbox `sandboxId` are still kept. */
  keepsEnded(sandboxId: string): boolean {
    return this.removals.has(sandboxId);
  }

  /**
   * The records `writeEnded` wrote for `sandboxId`, while its logs are kept (after that,
   * undefined). Read synchronously: a small file, read only when a caller asks for an ended
   * sandbox's processes.
   */
  readEnded(sandboxId: string): EndedProcessRecord[] | undefined {
    if (!this.keepsEnded(sandboxId)) return undefined;
    try {
      return JSON.parse(readFileSync(join(outputLogDir(this.dataDir, sandboxId), ENDED_PROCESSES_FILE), 'utf8')) as EndedProcessRecord[];
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === 'ENOENT') return [];
      this.fail({ tenantId: '?', sandboxId }, error);
      return undefined;
    }
  }

  /** Removes the logs whose retention ended; returns how many sandboxes' logs went. */
  async sweep(nowMs: number = this.now()): Promise<number> {
    let removed = 0;
    for (const [sandboxId, due] of this.removals) {
      if (due > nowMs) continue;
      this.removals.delete(sandboxId);
      try {
        await this.remove(sandboxId);
        removed++;
      } catch (error) {
        // Still on disk and still charged: a later sweep tries again; the others go on now.
        this.removals.set(sandboxId, nowMs + SWEEP_RETRY_MS);
        this.fail({ tenantId: this.held.get(sandboxId)?.tenantId ?? '?', sandboxId }, error);
      }
    }
    return removed;
  }

  /**
   * At start: logs of sandboxes that are not live belong to a previous run and go; the logs of
   * live ones stay and are charged to their tenants again.
   */
  async reconcile(live: readonly LogOwner[]): Promise<void> {
    const owners = new Map(live.map((owner) => [owner.sandboxId, owner]));
    const names = await readdir(join(this.dataDir, 'logs')).catch(() => [] as string[]);
    for (const name of names) {
      const owner = owners.get(name);
      if (!owner) {
        await removeOutputLogs(this.dataDir, name).catch((error: unknown) => this.fail({ tenantId: '?', sandboxId: name }, error));
        continue;
      }
      const bytes = await directoryBytes(outputLogDir(this.dataDir, name));
      this.options.budget?.restore(owner, bytes);
      this.hold(owner, bytes);
    }
  }

  /** Waits for the logs being closed. */
  async flushed(): Promise<void> {
    await Promise.all([...this.pending]);
  }

  /** Removes every log of a sandbox once its processes' logs are closed, and gives their disk back. */
  async remove(sandboxId: string): Promise<void> {
    await this.flushed();
    this.dirs.delete(sandboxId);
    await removeOutputLogs(this.dataDir, sandboxId);
    const held = this.held.get(sandboxId);
    this.held.delete(sandboxId);
    if (held) this.options.budget?.release(held, held.bytes);
    if (this.openLogs.has(sandboxId)) this.orphans.add(sandboxId);
    this.onRemoved(sandboxId);
  }

  private hold(owner: LogOwner, bytes: number): void {
    const held = this.held.get(owner.sandboxId);
    if (held) held.bytes += bytes;
    else this.held.set(owner.sandboxId, new HeldLogs(owner.tenantId, owner.sandboxId, owner.quotaBytes, bytes));
  }

  /** The sandbox's log directory, made once per sandbox rather than once per process. */
  private ensureDir(sandboxId: string): Promise<void> {
    let made = this.dirs.get(sandboxId);
    if (!made) {
      made = mkdir(outputLogDir(this.dataDir, sandboxId), { recursive: true, mode: 0o700 }).then(() => undefined);
      made.catch(() => this.dirs.delete(sandboxId));
      this.dirs.set(sandboxId, made);
    }
    return made;
  }

  private track(promise: Promise<unknown>): void {
    this.pending.add(promise);
    void promise.finally(() => this.pending.delete(promise));
  }

  private fail(owner: LogOwner & { pid?: number }, error: unknown): void {
    this.failures++;
    const which = owner.pid === undefined ? `of sandbox ${owner.sandboxId}` : `of process ${owner.pid} in ${owner.sandboxId}`;
    process.stderr.write(`capsule: output log ${which} failed: ${(error as Error).message}\n`);
  }
}

async function directoryBytes(dir: string): Promise<number> {
  let bytes = 0;
  for (const name of await readdir(dir).catch(() => [] as string[])) bytes += (await stat(join(dir, name)).catch(() => undefined))?.size ?? 0;
  return bytes;
}
