import { randomBytes } from 'node:crypto';
import type { Readable } from 'node:stream';
import { SandboxError, isSandboxError } from '../../errors/index.js';
import type { BackendSandbox } from '../../backends/backend.js';
import type { FileEntry } from '../../wire/index.js';
import { parseEntries, FIND_FORMAT } from './entries.js';
import { fileError, type FileErrorContext } from './errors.js';
import { HelperGuard, StderrTail, helperRequest, lostError, shArgv, startHelper } from './helper.js';
import { UPLOAD_TEMP_PREFIX, WRITE_SCRIPT } from './scripts.js';

/** Bytes per frame: one `head -c` in the sandbox per frame. */
export const FRAME_BYTES = 1024 * 1024;
/**
 * Frames sent but not yet acknowledged. The agent queues a child's stdin without bound (in the
 * sandbox's memory) and AgentProcess.write has no drain signal, so the helper's acks are the flow
 * control: at most this many MiB are in flight between the host and the file.
 */
export const WINDOW_FRAMES = 4;

/** The entry printed after the upload is one find record: paths are at most 4 KiB each. */
const MAX_RECORD_BYTES = 64 * 1024;

export type WriteData = Readable | Buffer | string;

export interface WriteOptions {
  signal?: AbortSignal | undefined;
  /** The write fails when no frame is acknowledged (or no data arrives) for this long. */
  idleTimeoutMs: number;
  context: Omit<FileErrorContext, 'operation'>;
}

/** Streams `data` into a temp file in the sandbox and renames it over `path`. */
export async function writeFile(sandbox: BackendSandbox, path: string, data: WriteData, options: WriteOptions): Promise<FileEntry> {
  const guardOptions = { operation: 'write' as const, path, timeoutMs: options.idleTimeoutMs, signal: options.signal, terminateFirst: true };
  const tempName = `${UPLOAD_TEMP_PREFIX}${randomBytes(8).toString('hex')}`;
  const proc = await startHelper(sandbox, helperRequest(shArgv(WRITE_SCRIPT, path, FIND_FORMAT, tempName), true), guardOptions);
  const guard = new HelperGuard(proc, guardOptions);
  const stderr = new StderrTail();
  const record: Buffer[] = [];
  let recordBytes = 0;
  let acked = 0;
  let finished = false;
  let wake: (() => void) | undefined;
  proc.onStdout((chunk) => {
    guard.touch();
    if (finished) {
      recordBytes += chunk.length;
      if (recordBytes <= MAX_RECORD_BYTES) record.push(chunk); // more is forged; the parse will reject it
      return;
    }
    const end = chunk.indexOf(0x3d); // '=': every frame is in the file, the entry follows
    acked += end === -1 ? chunk.length : end;
    if (end !== -1) {
      finished = true;
      record.push(chunk.subarray(end + 1));
    }
    wake?.();
  });
  proc.onStderr((chunk) => stderr.push(chunk));
  let exited = false;
  const exit = proc.exited.then((result) => {
    exited = true;
    wake?.();
    return result;
  });
  const progress = (): Promise<void> => new Promise((resolve) => (wake = resolve));

  let sourceError: unknown;
  let isSourceDone = false;
  const source = frames(data, FRAME_BYTES)[Symbol.asyncIterator]();
  try {
    let sent = 0;
    for (;;) {
      const pending = source.next();
      pending.catch(() => undefined); // if the helper exits first, a later failure of the source is moot
      const next = await Promise.race([pending, exit.then(() => undefined)]);
      if (next === undefined) break;
      if (next.done === true) {
        isSourceDone = true;
        break;
      }
      guard.touch();
      while (sent - acked >= WINDOW_FRAMES && !exited) await progress();
      if (exited) break;
      proc.write(`${next.value.length}\n`);
      proc.write(next.value);
      sent += 1;
    }
    if (isSourceDone && !exited) {
      proc.write('0\n');
      proc.closeStdin();
    }
  } catch (error) {
    // PROCESS_NOT_FOUND: the helper exited between two writes, and its exit says why. Anything
    // else is the data source failing (a client that went away): stop the helper, which then
    // removes its temp file.
    if (!isSandboxError(error, 'PROCESS_NOT_FOUND')) {
      sourceError = error;
      guard.kill('aborted');
    }
  } finally {
    if (!isSourceDone) {
      // The helper ended before the data did: release the source without waiting on it.
      if (typeof data !== 'string' && !Buffer.isBuffer(data)) data.destroy();
      source.return?.(undefined).catch(() => undefined);
    }
  }
  const result = await exit;
  guard.dispose();
  if (sourceError !== undefined) {
    throw new SandboxError('ABORTED', `write of ${path} stopped: reading the data to write failed: ${(sourceError as Error).message}`, {
      details: { path },
      cause: sourceError,
    });
  }
  const guardError = guard.error();
  if (guardError) throw guardError;
  if (result.lost) throw lostError(sandbox.id, 'write', path);
  if (result.exitCode !== 0 || !finished) throw fileError(stderr.failure(result), { ...options.context, operation: 'write' });
  const [entry] = parseEntries(Buffer.concat(record));
  if (entry === undefined) throw fileError(stderr.failure(result), { ...options.context, operation: 'write' });
  return entry;
}

/** Cuts any input into frames of exactly `size` bytes (the last may be shorter). */
export async function* frames(data: WriteData, size: number): AsyncGenerator<Buffer> {
  if (typeof data === 'string' || Buffer.isBuffer(data)) {
    const bytes = typeof data === 'string' ? Buffer.from(data) : data;
    for (let offset = 0; offset < bytes.length; offset += size) yield bytes.subarray(offset, offset + size);
    return;
  }
  let parts: Buffer[] = [];
  let held = 0;
  for await (const chunk of data as AsyncIterable<Buffer | string>) {
    let bytes = typeof chunk === 'string' ? Buffer.from(chunk) : chunk;
    while (held + bytes.length >= size) {
      const take = size - held;
      parts.push(bytes.subarray(0, take));
      yield Buffer.concat(parts, size);
      parts = [];
      held = 0;
      bytes = bytes.subarray(take);
    }
    if (bytes.length > 0) {
      parts.push(bytes);
      held += bytes.length;
    }
  }
  if (held > 0) yield Buffer.concat(parts, held);
}
