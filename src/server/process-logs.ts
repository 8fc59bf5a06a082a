import { mkdir, readdir } from 'node:fs/promises';
import { join } from 'node:path';
import { DEFAULT_OUTPUT_LOG_BYTES, OutputLogWriter, outputLogDir, removeOutputLogs, type OutputStream } from '../engine/output-log.js';
import type { ObservedProcess } from '../engine/events.js';


/**
 * The full output of every process, written to `<dataDir>/logs/<sandboxId>/<pid>.ndjson`
 * (bounded per process, see OutputLogWriter) from the engine's process observer. A log that
 * cannot be written is counted and reported on stderr, never silently dropped.
 */
export class ProcessLogs {
  /** Writers of running processes; undefined when one could not be made (counted in `failures`). */
  private readonly open = new Map<string, OutputLogWriter | undefined>();
  private readonly pending = new Set<Promise<unknown>>();
  private readonly dirs = new Map<string, Promise<void>>();
  /** Sandboxes that ended, and when their logs go. */
  private readonly removals = new Map<string, number>();
  failures = 0;

  /** `retentionMs`: how long the logs of an ended sandbox are kept. @default 1 hour */
  constructor(
    readonly dataDir: string,
    private readonly options: { maxBytes?: number; retentionMs?: number; now?: () => number } = {},
  ) {}

  /** The sandbox ended: its logs are removed by the sweep after the retention. */
  sandboxEnded(sandboxId: string): void {
    const now = this.options.now ?? Date.now;
    this.removals.set(sandboxId, now() + (this.options.retentionMs ?? 60 * 60 * 1000));
  }

  /** Removes the logs whose retention ended; returns how many sandboxes' logs went. */
  async sweep(nowMs: number = (this.options.now ?? Date.now)()): Promise<number> {
    let removed = 0;
    for (const [sandboxId, due] of this.removals) {
      if (due > nowMs) continue;
      this.removals.delete(sandboxId);
      await this.remove(sandboxId);
      removed++;
    }
    return removed;
  }

  /** At start: logs of sandboxes that are no longer live belong to a previous run; they go. */
  async removeAllExcept(liveIds: ReadonlySet<string>): Promise<void> {
    const names = await readdir(join(this.dataDir, 'logs')).catch(() => [] as string[]);
    for (const name of names) if (!liveIds.has(name)) await this.remove(name).catch(() => undefined);
  }

  started(process: ObservedProcess): void {
    this.logOf(process);
  }

  output(process: ObservedProcess, stream: OutputStream, data: Buffer): void {
    this.logOf(process)?.write(stream, data);
  }

  /** The process ended: flush and close its log. */
  ended(process: ObservedProcess): void {
    const key = keyOf(process);
    const writer = this.open.get(key);
    this.open.delete(key);
    if (writer) this.track(writer.close().catch((error: unknown) => this.fail(process, error)));
  }

  /**
   * Waits for queued writes; with `process`, first writes what that running process buffered
   * (a reader wants its whole log so far).
   */
  async flushed(process?: { sandboxId: string; pid: number }): Promise<void> {
    const writer = process === undefined ? undefined : this.open.get(keyOf(process));
    if (writer) this.track(writer.flush());
    await Promise.all([...this.pending]);
  }

  /** Removes every log of a sandbox once its processes' logs are closed. */
  async remove(sandboxId: string): Promise<void> {
    await this.flushed();
    this.dirs.delete(sandboxId);
    await removeOutputLogs(this.dataDir, sandboxId);
  }

  async close(): Promise<void> {
    for (const [key, writer] of this.open) {
      this.open.delete(key);
      if (writer) this.track(writer.close().catch(() => undefined));
    }
    await this.flushed();
  }

  private logOf(process: ObservedProcess): OutputLogWriter | undefined {
    const key = keyOf(process);
    if (this.open.has(key)) return this.open.get(key);
    let writer: OutputLogWriter | undefined;
    try {
      writer = new OutputLogWriter({
        dataDir: this.dataDir,
        sandboxId: process.sandboxId,
        pid: process.pid,
        maxBytes: this.options.maxBytes ?? DEFAULT_OUTPUT_LOG_BYTES,
        ensureDir: () => this.ensureDir(process.sandboxId),
      });
    } catch (error) {
      this.fail(process, error);
    }
    this.open.set(key, writer);
    return writer;
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

  private fail(process: ObservedProcess, error: unknown): void {
    this.failures++;
    writeStderr(`capsule: output log of process ${process.pid} in ${process.sandboxId} failed: ${(error as Error).message}\n`);
  }
}

function keyOf(process: Pick<ObservedProcess, 'sandboxId' | 'pid'>): string {
  return `${process.sandboxId}/${process.pid}`;
}

function writeStderr(line: string): void {
  process.stderr.write(line);
}
