import { open, rm, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { SandboxError } from '../errors/index.js';

/**
 * The on-disk log of a process's output: `<dataDir>/logs/<sandboxId>/<pid>.output`, a sequence of
 * records, each a 16-byte header (byte 0: stream, 1 stdout / 2 stderr; bytes 4-7: the data's
 * length, u32 LE; bytes 8-15: epoch milliseconds when it arrived, f64 LE) and the raw bytes. Raw,
 * not base64 in JSON: output is written as it came (no copy, no encoding) and costs its own size
 * on disk. It is where a process's kept output lives (a reattach replays it from here, see
 * ProcessOutput) and what `GET .../processes/{pid}/log` serves, as NDJSON. It keeps the first
 * bytes: everything within the sandbox's output caps, then what fits in `DEFAULT_OUTPUT_LOG_BYTES` more.
 */

/** Room in a process's log for output past the sandbox's caps. */
export const DEFAULT_OUTPUT_LOG_BYTES = 64 * 1024 * 1024;
const SANDBOX_ID = /^[a-z0-9_-]{1,64}$/;

export type OutputStream = 'stdout' | 'stderr';

export interface OutputLogEntry {
  /** Epoch milliseconds when the output arrived. */
  t: number;
  stream: OutputStream;
  data: Buffer;
}

export interface OutputLogOptions {
  dataDir: string;
  sandboxId: string;
  pid: number;
}

export function outputLogDir(dataDir: string, sandboxId: string): string {
  if (!SANDBOX_ID.test(sandboxId)) {
    throw new SandboxError('INVALID_ARGUMENT', `"${sandboxId.slice(0, 80)}" is not a sandbox id`, { details: { field: 'sandboxId' } });
  }
  return join(dataDir, 'logs', sandboxId);
}

export function outputLogPath(options: OutputLogOptions): string {
  if (!Number.isSafeInteger(options.pid) || options.pid < 0) {
    throw new SandboxError('INVALID_ARGUMENT', `${options.pid} is not a process id`, { details: { field: 'pid' } });
  }
  return join(outputLogDir(options.dataDir, options.sandboxId), `${options.pid}.output`);
}

export const LOG_HEADER_BYTES = 16;
const STREAM_CODES: Record<OutputStream, number> = { stdout: 1, stderr: 2 };

/** The header of one record. */
export function encodeLogHeader(t: number, stream: OutputStream, dataBytes: number): Buffer {
  const header = Buffer.alloc(LOG_HEADER_BYTES);
  header.writeUInt8(STREAM_CODES[stream], 0);
  header.writeUInt32LE(dataBytes, 4);
  header.writeDoubleLE(t, 8);
  return header;
}

/** Bytes of a record holding `dataBytes` of output. */
export function logRecordBytes(dataBytes: number): number {
  return LOG_HEADER_BYTES + dataBytes;
}

/** A record read back, with its length in the file. */
export interface LogRecord extends OutputLogEntry {
  recordBytes: number;
}

const READ_BLOCK_BYTES = 256 * 1024;

/**
 * The records of a log file between two byte offsets (which must fall on record starts), in
 * order. Each record's data is its own memory (a reader may keep it).
 */
export async function* readLogRecords(path: string, start: number, end: number, signal?: AbortSignal): AsyncGenerator<LogRecord> {
  if (end <= start) return;
  const handle = await open(path, 'r');
  try {
    let offset = start;
    const header = Buffer.alloc(LOG_HEADER_BYTES);
    // Small records are read a block at a time; a large one straight into its own buffer.
    let block = Buffer.alloc(0);
    let blockAt = 0;
    const readAt = async (target: Buffer, position: number): Promise<void> => {
      let done = 0;
      while (done < target.length) {
        const { bytesRead } = await handle.read(target, done, target.length - done, position + done);
        if (bytesRead === 0) throw new SandboxError('INTERNAL', `the output log ${path} ends inside a record at byte ${position + done}`);
        done += bytesRead;
      }
    };
    while (offset < end) {
      signal?.throwIfAborted();
      if (offset < blockAt || offset + LOG_HEADER_BYTES > blockAt + block.length) {
        block = Buffer.alloc(Math.min(READ_BLOCK_BYTES, end - offset));
        blockAt = offset;
        await readAt(block, offset);
      }
      block.copy(header, 0, offset - blockAt, offset - blockAt + LOG_HEADER_BYTES);
      const code = header.readUInt8(0);
      const length = header.readUInt32LE(4);
      const t = header.readDoubleLE(8);
      const stream: OutputStream | undefined = code === 1 ? 'stdout' : code === 2 ? 'stderr' : undefined;
      const dataAt = offset + LOG_HEADER_BYTES;
      if (!stream || dataAt + length > end) throw new SandboxError('INTERNAL', `the output log ${path} has a bad record at byte ${offset}`);
      let data: Buffer;
      if (dataAt + length <= blockAt + block.length) {
        data = block.subarray(dataAt - blockAt, dataAt - blockAt + length);
      } else {
        data = Buffer.alloc(length);
        await readAt(data, dataAt);
      }
      offset = dataAt + length;
      yield { t, stream, data, recordBytes: LOG_HEADER_BYTES + length };
    }
  } finally {
    await handle.close();
  }
}

/** Whether a process has a log, and its size in bytes. */
export async function outputLogInfo(options: OutputLogOptions): Promise<{ exists: boolean; bytes: number }> {
  const info = await stat(outputLogPath(options)).catch(() => undefined);
  return { exists: info !== undefined, bytes: info?.size ?? 0 };
}

export interface ReadOutputLogOptions extends OutputLogOptions {
  /** Only this stream. @default both */
  stream?: OutputStream;
  signal?: AbortSignal;
}

/** The log of a process, oldest first. `PROCESS_NOT_FOUND` when it has none. */
export async function* readOutputLog(options: ReadOutputLogOptions): AsyncGenerator<OutputLogEntry> {
  const info = await outputLogInfo(options);
  if (!info.exists) {
    throw new SandboxError('PROCESS_NOT_FOUND', `process ${options.pid} of sandbox ${options.sandboxId} has no output log`, {
      details: { sandboxId: options.sandboxId, pid: options.pid },
      hint: 'List the processes of the sandbox; logs are kept while the sandbox is.',
    });
  }
  for await (const record of readLogRecords(outputLogPath(options), 0, info.bytes, options.signal)) {
    if (options.stream !== undefined && record.stream !== options.stream) continue;
    yield { t: record.t, stream: record.stream, data: record.data };
  }
}

/** Removes every output log of a sandbox (after its logs' retention). */
export async function removeOutputLogs(dataDir: string, sandboxId: string): Promise<void> {
  await rm(outputLogDir(dataDir, sandboxId), { recursive: true, force: true });
}
