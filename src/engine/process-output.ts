import { open, type FileHandle } from 'node:fs/promises';
import { SandboxError } from '../errors/index.js';
import { DEFAULT_OUTPUT_LOG_BYTES, encodeLogHeader, logRecordBytes, readLogRecords, type OutputStream } from './output-log.js';

/**
 * Where a process's log may grow: the tenant's disk quota on the server, nothing in a one-process
 * engine. Bytes are counted as they are on disk (records with their headers).
 */
export interface LogBudget {
  /** Takes `bytes` more for this log; false when they do not fit. */
  take(bytes: number): boolean;
  /** Gives back bytes taken (or reserved) that the log does not hold. */
  release(bytes: number): void;
}

export interface ProcessOutputOptions {
  /** The log file (see output-log.ts). */
  path: string;
  /** Makes the log's directory; called once, before the file is first opened. */
  ensureDir: () => Promise<void>;
  /** Log bytes reserved in `budget` for the output within the caps: it is never refused room. @default 0 */
  reservedBytes?: number;
  /** Log bytes for output past the caps (first come, first kept). @default 64 MiB */
  extraBytes?: number;
  budget?: LogBudget;
  /** @default Date.now */
  now?: () => number;
  /**
   * Told `true` when more than 512 KiB wait to be written (the producer should pause: the disk is
   * slower than the process) and `false` once under 128 KiB again.
   */
  onPressure?: (high: boolean) => void;
}

/** Where a closed log's records are in its file: enough to read it back (ProcessOutput.ofClosed). */
export interface LogExtent {
  /** Bytes logged (both streams). */
  position: number;
  /** This process's records in the file: from `baseOffset` to `fileEnd`. */
  baseOffset: number;
  fileEnd: number;
}

/** A piece of logged output as a reader gets it; `pos` counts logged bytes of both streams. */
export interface OutputPiece {
  pos: number;
  t: number;
  stream: OutputStream;
  data: Buffer;
}

interface Chunk {
  pos: number;
  t: number;
  stream: OutputStream;
  data: Buffer;
}

/** Output held before a write: most processes print less, and write their log once, at the end. */
const FLUSH_BYTES = 64 * 1024;
const EMPTY = Buffer.alloc(0);
/** Neighbouring chunks of one stream up to this size share a record. */
const COALESCE_BYTES = 16 * 1024;
/** Buffers per writev call (IOV_MAX is 1024). */
const WRITEV_PARTS = 512;
const FLUSH_CHUNKS = 512;
const PRESSURE_HIGH_BYTES = 512 * 1024;
const PRESSURE_LOW_BYTES = 128 * 1024;

/**
 * The output of one process, in its log on disk. Logged output is held in memory only until it is
 * written (a bounded window); readers take it from there when they keep up and from the file when
 * they come late, so the heap holds no ended process's output. What is logged is decided as it
 * arrives: output within the caps (`kept`) always while the budget has room, output past them
 * while `extraBytes` and the budget have room; `append` says which, so that what a reader replays
 * is exactly what was kept.
 */
export class ProcessOutput {
  /** Bytes logged so far (both streams): the position the next logged byte gets. */
  position = 0;
  /** Output that arrived but was not logged (no room), in bytes. */
  droppedBytes = 0;
  private window: Chunk[] = [];
  /** Everything before this position is handed to the writer; `unqueuedChunks` chunks are not. */
  private queuedPos = 0;
  private unqueuedChunks = 0;
  /** Everything before this position is in the file, which holds this process's records from `baseOffset` to `fileEnd`. */
  private diskPos = 0;
  private baseOffset = 0;
  private fileEnd = 0;
  private handle: FileHandle | undefined;
  private writes: Promise<void> = Promise.resolve();
  private failure: unknown;
  private closed = false;
  /** Until the log closes: it pauses the process's agent, which an ended process lets go of. */
  private onPressure: ((high: boolean) => void) | undefined;
  private pressured = false;
  private allowance: number;
  private charged: number;
  private extraUsed = 0;
  private readonly refused = { stdout: false, stderr: false };
  private readonly waiters = new Set<() => void>();
  private readonly extraBytes: number;
  private readonly now: () => number;

  private readonly options: Omit<ProcessOutputOptions, 'onPressure'>;

  constructor({ onPressure, ...options }: ProcessOutputOptions) {
    this.options = options;
    this.onPressure = onPressure;
    this.allowance = options.reservedBytes ?? 0;
    this.charged = this.allowance;
    this.extraBytes = options.extraBytes ?? DEFAULT_OUTPUT_LOG_BYTES;
    this.now = options.now ?? Date.now;
  }

  /**
   * A closed log, read back from its file at `extent` (its `extent` when it closed): for the
   * processes of a sandbox the engine no longer holds in memory. It takes no more output.
   */
  static ofClosed(path: string, extent: LogExtent): ProcessOutput {
    const log = new ProcessOutput({ path, ensureDir: () => Promise.resolve() });
    log.closed = true;
    log.position = log.queuedPos = log.diskPos = extent.position;
    log.baseOffset = extent.baseOffset;
    log.fileEnd = extent.fileEnd;
    return log;
  }

  /** Whether a write of it failed: what it held past the failure was served from memory only. */
  get failed(): boolean {
    return this.failure !== undefined;
  }

  /** Where its records are in the file (what it holds written); whole once `close()` resolved. */
  get extent(): LogExtent {
    return { position: this.diskPos, baseOffset: this.baseOffset, fileEnd: this.fileEnd };
  }

  /**
   * Logs a chunk of output; `kept` when it is within the stream's cap. Returns false when it was
   * not logged: no room, or the log is closed or failed. A stream refused kept output logs
   * nothing more (so a stream's kept output is always a prefix of what its log holds).
   */
  append(stream: OutputStream, data: Buffer, kept: boolean): boolean {
    if (data.length === 0) return true;
    const cost = logRecordBytes(data.length);
    const fits =
      !this.closed &&
      this.failure === undefined &&
      !this.refused[stream] &&
      (kept ? this.charge(cost, true) : this.extraUsed + cost <= this.extraBytes && this.charge(cost, false));
    if (!fits) {
      if (kept) this.refused[stream] = true;
      this.droppedBytes += data.length;
      return false;
    }
    if (!kept) this.extraUsed += cost;
    this.window.push({ pos: this.position, t: this.now(), stream, data });
    this.position += data.length;
    this.unqueuedChunks++;
    if (this.position - this.queuedPos >= FLUSH_BYTES || this.unqueuedChunks >= FLUSH_CHUNKS) void this.flush();
    if (!this.pressured && this.position - this.diskPos > PRESSURE_HIGH_BYTES) {
      this.pressured = true;
      this.onPressure?.(true);
    }
    this.notify();
    return true;
  }

  /** Wakes readers waiting for more (the process's other events). */
  notify(): void {
    for (const wake of this.waiters) wake();
    this.waiters.clear();
  }

  /** Writes what is held, creating the file if need be, so the file holds everything so far. */
  flush(): Promise<void> {
    const from = this.queuedPos;
    const to = this.position;
    this.queuedPos = to;
    this.unqueuedChunks = 0;
    this.writes = this.writes.then(() => this.write(from, to)).catch((error: unknown) => {
      this.failure ??= error;
      // Nothing more is logged, so nothing more is waited for.
      if (this.pressured) {
        this.pressured = false;
        this.onPressure?.(false);
      }
    });
    return this.writes;
  }

  /** Bytes of this process's lines in the file. */
  get bytesOnDisk(): number {
    return this.fileEnd - this.baseOffset;
  }

  /** No more output: writes the rest, closes the file and settles the budget (it keeps what the file holds). */
  async close(): Promise<{ bytes: number }> {
    this.closed = true;
    this.notify();
    await this.flush();
    this.onPressure = undefined;
    await this.handle?.close().catch((error: unknown) => (this.failure ??= error));
    this.handle = undefined;
    const bytes = this.bytesOnDisk;
    if (this.charged > bytes) this.options.budget?.release(this.charged - bytes);
    this.charged = bytes;
    if (this.failure !== undefined) {
      throw new SandboxError('INTERNAL', `writing the output log ${this.options.path} failed`, { cause: this.failure });
    }
    return { bytes };
  }

  /**
   * The logged output from the start, in order: from the file up to what is written, then from
   * memory, then as it arrives (and an empty piece each time `notify()` woke a waiting reader). Ends once `until()` returns a position the reader has reached,
   * when the log is closed and read to its end, or when `signal` aborts.
   */
  async *read(until: () => number | undefined, signal?: AbortSignal): AsyncGenerator<OutputPiece> {
    let p = 0;
    // The last line start the reader knows, to continue the file from.
    let anchor: { pos: number; offset: number } | undefined;
    for (;;) {
      const stop = until();
      if (stop !== undefined && p >= stop) return;
      if (p < this.diskPos) {
        const at = anchor ?? { pos: 0, offset: this.baseOffset };
        anchor = at;
        for await (const record of this.records(at.offset, this.fileEnd, signal)) {
          const start = at.pos;
          at.pos += record.data.length;
          at.offset += record.recordBytes;
          if (at.pos <= p) continue;
          yield { pos: p, t: record.t, stream: record.stream, data: record.data.subarray(p - start) };
          p = at.pos;
          const stopNow = until();
          if (stopNow !== undefined && p >= stopNow) return;
        }
        continue;
      }
      if (p < this.position) {
        const chunk = this.chunkAt(p);
        yield { pos: p, t: chunk.t, stream: chunk.stream, data: chunk.data.subarray(p - chunk.pos) };
        p = chunk.pos + chunk.data.length;
        continue;
      }
      if (this.closed || signal?.aborted) return;
      await this.changed(signal);
      // Woken without new output (the process's other events): an empty piece lets the reader look.
      if (p >= this.position) yield { pos: p, t: this.now(), stream: 'stdout', data: EMPTY };
    }
  }

  /** Takes `cost` from the reservation (kept output only) or else from the budget. */
  private charge(cost: number, fromReservation: boolean): boolean {
    if (fromReservation && cost <= this.allowance) {
      this.allowance -= cost;
      return true;
    }
    const more = fromReservation ? cost - this.allowance : cost;
    if (this.options.budget && !this.options.budget.take(more)) return false;
    if (fromReservation) this.allowance = 0;
    this.charged += more;
    return true;
  }

  private async write(from: number, to: number): Promise<void> {
    // Nothing new (a flush of a closed log, a reader's flush): the file is not opened again, which
    // would take its end for this log's start and leave readers nothing to read, forever.
    if (this.failure !== undefined || from >= to) return;
    if (!this.handle) {
      await this.options.ensureDir();
      this.handle = await open(this.options.path, 'a', 0o600);
      this.baseOffset = this.fileEnd = (await this.handle.stat()).size;
    }
    const parts = this.recordsBetween(from, to);
    let bytes = 0;
    for (const part of parts) bytes += part.length;
    // The output goes to the file as it came: headers and data in one gathered write, no copy.
    for (let i = 0; i < parts.length; i += WRITEV_PARTS) {
      const batch = parts.slice(i, i + WRITEV_PARTS);
      let left = batch.reduce((sum, part) => sum + part.length, 0);
      while (left > 0) {
        const { bytesWritten } = await this.handle.writev(batch);
        left -= bytesWritten;
        if (left > 0) skipWritten(batch, bytesWritten);
      }
    }
    this.fileEnd += bytes;
    this.diskPos = to;
    while (this.window.length > 0 && this.window[0]!.pos + this.window[0]!.data.length <= this.diskPos) this.window.shift();
    if (this.pressured && this.position - this.diskPos < PRESSURE_LOW_BYTES) {
      this.pressured = false;
      this.onPressure?.(false);
    }
  }

  /**
   * Header and data buffers of the records for the chunks in [from, to). Small neighbours of one
   * stream become one record (a trickle of tiny writes does not cost a header each).
   */
  private recordsBetween(from: number, to: number): Buffer[] {
    const parts: Buffer[] = [];
    let run: Chunk[] = [];
    let runBytes = 0;
    const end = (): void => {
      if (run.length === 0) return;
      const data = run.length === 1 ? run[0]!.data : Buffer.concat(run.map((c) => c.data), runBytes);
      parts.push(encodeLogHeader(run[0]!.t, run[0]!.stream, data.length), data);
      run = [];
      runBytes = 0;
    };
    for (const chunk of this.window) {
      if (chunk.pos < from) continue;
      if (chunk.pos >= to) break;
      if (run.length > 0 && (run[0]!.stream !== chunk.stream || runBytes + chunk.data.length > COALESCE_BYTES)) end();
      run.push(chunk);
      runBytes += chunk.data.length;
    }
    end();
    return parts;
  }

  /** The held chunk holding position `p` (diskPos <= p < position). */
  private chunkAt(p: number): Chunk {
    let low = 0;
    let high = this.window.length - 1;
    while (low < high) {
      const mid = (low + high + 1) >> 1;
      if (this.window[mid]!.pos <= p) low = mid;
      else high = mid - 1;
    }
    return this.window[low]!;
  }

  private async *records(start: number, end: number, signal?: AbortSignal) {
    try {
      yield* readLogRecords(this.options.path, start, end, signal);
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== 'ENOENT') throw error;
      throw new SandboxError('PROCESS_NOT_FOUND', 'the output log of this process was removed', {
        hint: 'Logs are kept while the sandbox lives and for an hour after it ends.',
      });
    }
  }

  /** Resolves at the next append, notify or close, or when `signal` aborts. */
  private changed(signal?: AbortSignal): Promise<void> {
    // One abort listener per wait, removed when woken: a long stream must not pile them up.
    return new Promise<void>((resolve) => {
      const onAbort = (): void => resolve();
      this.waiters.add(() => {
        signal?.removeEventListener('abort', onAbort);
        resolve();
      });
      signal?.addEventListener('abort', onAbort, { once: true });
    });
  }
}

/** After a short gathered write: drops the bytes written from the front of `parts`. */
function skipWritten(parts: Buffer[], written: number): void {
  let left = written;
  while (left > 0 && parts.length > 0) {
    const first = parts[0]!;
    if (first.length <= left) {
      left -= first.length;
      parts.shift();
    } else {
      parts[0] = first.subarray(left);
      left = 0;
    }
  }
}
