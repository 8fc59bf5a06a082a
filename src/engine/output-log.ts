import { createReadStream } from 'node:fs';
import { mkdir, open, rename, rm, stat, type FileHandle } from 'node:fs/promises';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { SandboxError } from '../errors/index.js';

/**
 * The full output of a process, kept out of API replies: NDJSON at
 * `<dataDir>/logs/<sandboxId>/<pid>.ndjson`, one line per chunk
 * `{"t":<epoch ms>,"stream":"stdout"|"stderr","data":"<base64>"}`, bounded per process. When a
 * file reaches half the bound it is rotated to `<pid>.1.ndjson` (replacing the previous one), so
 * at most `maxBytes` are kept and the oldest output goes first; `rotated` says that happened.
 */

export const DEFAULT_OUTPUT_LOG_BYTES = 64 * 1024 * 1024;
const SANDBOX_ID = /^[a-z0-9_-]{1,64}$/;

export type OutputStream = 'stdout' | 'stderr';

export interface OutputLogEntry {
  /** Epoch milliseconds when the chunk arrived. */
  t: number;
  stream: OutputStream;
  data: Buffer;
}

export interface OutputLogOptions {
  dataDir: string;
  sandboxId: string;
  pid: number;
  /** Bound of the kept log (both files together). @default 64 MiB */
  maxBytes?: number;
}

export interface OutputLogWriterOptions extends OutputLogOptions {
  /** Makes the log directory; a caller that knows it exists can make this free. @default mkdir -p */
  ensureDir?: () => Promise<void>;
}

export function outputLogDir(dataDir: string, sandboxId: string): string {
  if (!SANDBOX_ID.test(sandboxId)) {
    throw new SandboxError('INVALID_ARGUMENT', `"${sandboxId.slice(0, 80)}" is not a sandbox id`, { details: { field: 'sandboxId' } });
  }
  return join(dataDir, 'logs', sandboxId);
}

function logPaths(options: OutputLogOptions): { current: string; previous: string } {
  if (!Number.isSafeInteger(options.pid) || options.pid < 0) {
    throw new SandboxError('INVALID_ARGUMENT', `${options.pid} is not a process id`, { details: { field: 'pid' } });
  }
  const dir = outputLogDir(options.dataDir, options.sandboxId);
  return { current: join(dir, `${options.pid}.ndjson`), previous: join(dir, `${options.pid}.1.ndjson`) };
}

/** Output kept in memory before the log file is touched: most processes print less than this. */
const BUFFER_BYTES = 64 * 1024;

/** One write to the current file, after rotating it away when `rotateFirst`. */
interface Segment {
  rotateFirst: boolean;
  data: Buffer;
}

/** Splits `lines` at the points where the current file (holding `written` bytes) must rotate. */
function plan(written: number, fileBytes: number, lines: Buffer[]): { segments: Segment[]; written: number } {
  const segments: Segment[] = [];
  let run: Buffer[] = [];
  let rotateFirst = false;
  let size = written;
  for (const line of lines) {
    if (size > 0 && size + line.length > fileBytes) {
      if (run.length > 0) segments.push({ rotateFirst, data: Buffer.concat(run) });
      run = [];
      rotateFirst = true;
      size = 0;
    }
    run.push(line);
    size += line.length;
  }
  if (run.length > 0) segments.push({ rotateFirst, data: Buffer.concat(run) });
  return { segments, written: size };
}

/**
 * Appends a process's output to its log. Output is buffered in memory up to 64 KiB, so a process
 * that prints less (most do) touches the disk once, when it ends, instead of opening its log
 * while it starts and writing every chunk. Larger output goes through an open file handle, in
 * order. All of it runs on the thread pool: creating a file can take milliseconds when the disk
 * is busy, and must not stall the event loop. `flush()` makes the log current for a reader.
 */
export class OutputLogWriter {
  private readonly paths: { current: string; previous: string };
  private readonly dir: string;
  private readonly fileBytes: number;
  private buffered: Buffer[] = [];
  private bufferedBytes = 0;
  private handle: FileHandle | undefined;
  private written = 0;
  private queue: Promise<void> = Promise.resolve();
  private failure: unknown;
  /** Older output was dropped to stay within the bound. */
  rotated = false;

  constructor(private readonly options: OutputLogWriterOptions) {
    this.paths = logPaths(options);
    this.dir = outputLogDir(options.dataDir, options.sandboxId);
    this.fileBytes = Math.max(1024, Math.floor((options.maxBytes ?? DEFAULT_OUTPUT_LOG_BYTES) / 2));
  }

  /** A writer whose (possibly empty) log file exists now. */
  static async open(options: OutputLogWriterOptions): Promise<OutputLogWriter> {
    const writer = new OutputLogWriter(options);
    await writer.flush();
    return writer;
  }

  /** Queues one chunk. A write failure is kept and thrown by `close()`, never swallowed. */
  write(stream: OutputStream, data: Buffer): void {
    const line = Buffer.from(`${JSON.stringify({ t: Date.now(), stream, data: data.toString('base64') })}\n`);
    this.buffered.push(line);
    this.bufferedBytes += line.length;
    if (this.bufferedBytes >= BUFFER_BYTES) void this.flush();
  }

  /** Writes what is buffered, creating the file if need be, so that a reader sees all of it. */
  flush(): Promise<void> {
    const lines = this.takeBuffered();
    this.queue = this.queue
      .then(() => this.append(lines))
      .catch((error: unknown) => {
        this.failure ??= error;
      });
    return this.queue;
  }

  async close(): Promise<{ rotated: boolean }> {
    await this.flush();
    await this.handle?.close();
    this.handle = undefined;
    if (this.failure !== undefined) {
      throw new SandboxError('INTERNAL', `writing the output log of process ${this.options.pid} failed`, { cause: this.failure });
    }
    return { rotated: this.rotated };
  }

  private takeBuffered(): Buffer[] {
    const lines = this.buffered;
    this.buffered = [];
    this.bufferedBytes = 0;
    return lines;
  }

  private async append(lines: Buffer[]): Promise<void> {
    if (!this.handle) {
      await (this.options.ensureDir?.() ?? mkdir(this.dir, { recursive: true, mode: 0o700 }));
      this.handle = await open(this.paths.current, 'a', 0o600);
      this.written = (await this.handle.stat()).size;
    }
    const { segments, written } = plan(this.written, this.fileBytes, lines);
    for (const segment of segments) {
      if (segment.rotateFirst) {
        await this.handle.close();
        await rename(this.paths.current, this.paths.previous);
        this.handle = await open(this.paths.current, 'a', 0o600);
        this.rotated = true;
      }
      await this.handle.write(segment.data);
    }
    this.written = written;
  }

}

export interface ReadOutputLogOptions extends OutputLogOptions {
  /** Only this stream. @default both */
  stream?: OutputStream;
  signal?: AbortSignal;
}

/** Whether a process has a log, its size, and whether older output was rotated away. */
export async function outputLogInfo(options: OutputLogOptions): Promise<{ exists: boolean; bytes: number; rotated: boolean }> {
  const paths = logPaths(options);
  const [current, previous] = await Promise.all([stat(paths.current).catch(() => undefined), stat(paths.previous).catch(() => undefined)]);
  // Two generations exist only after a rotation; a rotation replaced any earlier previous file.
  return { exists: current !== undefined, bytes: (current?.size ?? 0) + (previous?.size ?? 0), rotated: previous !== undefined };
}

/** The log of a process, oldest first. `PROCESS_NOT_FOUND` when it has none. */
export async function* readOutputLog(options: ReadOutputLogOptions): AsyncGenerator<OutputLogEntry> {
  const paths = logPaths(options);
  const info = await outputLogInfo(options);
  if (!info.exists) {
    throw new SandboxError('PROCESS_NOT_FOUND', `process ${options.pid} of sandbox ${options.sandboxId} has no output log`, {
      details: { sandboxId: options.sandboxId, pid: options.pid },
      hint: 'List the processes of the sandbox; logs are kept while the sandbox is.',
    });
  }
  for (const path of info.rotated ? [paths.previous, paths.current] : [paths.current]) {
    const lines = createInterface({ input: createReadStream(path), crlfDelay: Infinity });
    for await (const line of lines) {
      options.signal?.throwIfAborted();
      if (line === '') continue;
      const parsed = JSON.parse(line) as { t: number; stream: OutputStream; data: string };
      if (options.stream !== undefined && parsed.stream !== options.stream) continue;
      yield { t: parsed.t, stream: parsed.stream, data: Buffer.from(parsed.data, 'base64') };
    }
  }
}

/** Removes every output log of a sandbox (after its logs' retention). */
export async function removeOutputLogs(dataDir: string, sandboxId: string): Promise<void> {
  await rm(outputLogDir(dataDir, sandboxId), { recursive: true, force: true });
}
