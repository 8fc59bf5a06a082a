/**
 * The wire protocol between the host and `capsule-agent` (native/capsule-agent.c): pure encoding
 * and decoding, no I/O. Frame = u8 type + u32 id + u32 length + payload, big-endian, both ways.
 */
import { SandboxError } from '../../errors/index.js';

export const HEADER_BYTES = 9;
/** The agent exits on a larger frame; the client treats one from the agent as a broken agent. */
export const MAX_PAYLOAD_BYTES = 1024 * 1024;
/** The agent refuses a START whose label is larger (native/capsule-agent.c MAX_LABEL). */
export const MAX_LABEL_BYTES = 16 * 1024;

/** Frame types, as the ASCII byte on the wire. */
export const FrameType = {
  // host → agent
  Start: 0x53, // 'S'
  Input: 0x49, // 'I'
  CloseStdin: 0x43, // 'C'
  Signal: 0x4b, // 'K'
  Resize: 0x52, // 'R'
  Ping: 0x48, // 'H'
  RelayOpen: 0x50, // 'P'
  RelayData: 0x44, // 'D'
  RelayWindow: 0x57, // 'W'
  RelayClose: 0x5a, // 'Z'
  List: 0x47, // 'G': the agent answers with LIST_REPLY frames (same byte)
  Quit: 0x51, // 'Q': end every process and the agent (a supervised agent outlives its client)
  // agent → host
  Ready: 0x59, // 'Y'
  Started: 0x54, // 'T'
  StartFailed: 0x46, // 'F'
  Stdout: 0x4f, // 'O'
  Stderr: 0x45, // 'E'
  Exit: 0x58, // 'X'
  Pong: 0x48, // 'H'
  Log: 0x4c, // 'L'
  RelayOpened: 0x70, // 'p'
  RelayFromAgent: 0x64, // 'd'
  RelayAck: 0x77, // 'w'
  RelayClosed: 0x7a, // 'z'
  ListReply: 0x47, // 'G'
  /** From the supervisor (native/launch-supervise.c), never the agent: u64 output bytes it dropped. */
  Dropped: 0x44, // 'D'
} as const;

/**
 * Bytes either side of a relay may send before the other acknowledges them (native/agent-relay.h):
 * the agent buffers at most this much of the host's data per relay.
 */
export const RELAY_WINDOW_BYTES = 128 * 1024;

export interface Frame {
  type: number;
  id: number;
  payload: Buffer;
}

export function encodeFrame(type: number, id: number, payload: Buffer = Buffer.alloc(0)): Buffer {
  if (payload.length > MAX_PAYLOAD_BYTES) {
    throw new SandboxError('INVALID_ARGUMENT', `frame payload of ${payload.length} bytes exceeds 1 MiB`, {
      details: { payloadBytes: payload.length, maxPayloadBytes: MAX_PAYLOAD_BYTES },
    });
  }
  const frame = Buffer.allocUnsafe(HEADER_BYTES + payload.length);
  frame.writeUInt8(type, 0);
  frame.writeUInt32BE(id, 1);
  frame.writeUInt32BE(payload.length, 5);
  payload.copy(frame, HEADER_BYTES);
  return frame;
}

/**
 * Reassembles frames from a byte stream cut at arbitrary points. Chunks are kept as a list and
 * joined once per frame, so a frame that arrives one byte at a time costs O(n), not O(n²).
 */
export class FrameDecoder {
  private readonly chunks: Buffer[] = [];
  private buffered = 0;
  private header: { type: number; id: number; length: number } | null = null;

  /** Returns the frames completed by `chunk`; throws SandboxError('INTERNAL') on an oversized one. */
  push(chunk: Buffer): Frame[] {
    if (chunk.length > 0) {
      this.chunks.push(chunk);
      this.buffered += chunk.length;
    }
    const frames: Frame[] = [];
    for (;;) {
      if (this.header === null) {
        if (this.buffered < HEADER_BYTES) break;
        const head = this.take(HEADER_BYTES);
        const length = head.readUInt32BE(5);
        if (length > MAX_PAYLOAD_BYTES) {
          throw new SandboxError('INTERNAL', `agent sent a frame of ${length} bytes; the limit is 1 MiB`, {
            details: { payloadBytes: length, maxPayloadBytes: MAX_PAYLOAD_BYTES },
          });
        }
        this.header = { type: head.readUInt8(0), id: head.readUInt32BE(1), length };
      }
      if (this.buffered < this.header.length) break;
      frames.push({ type: this.header.type, id: this.header.id, payload: this.take(this.header.length) });
      this.header = null;
    }
    return frames;
  }

  /** Bytes received but not yet part of a complete frame. */
  get pendingBytes(): number {
    return this.buffered + (this.header === null ? 0 : HEADER_BYTES);
  }

  private take(n: number): Buffer {
    this.buffered -= n;
    const first = this.chunks[0];
    if (first !== undefined && first.length >= n) {
      if (first.length === n) this.chunks.shift();
      else this.chunks[0] = first.subarray(n);
      return first.subarray(0, n);
    }
    const out = Buffer.allocUnsafe(n);
    let filled = 0;
    while (filled < n) {
      const chunk = this.chunks[0];
      if (chunk === undefined) throw new SandboxError('INTERNAL', 'frame decoder ran out of buffered bytes');
      const used = Math.min(chunk.length, n - filled);
      chunk.copy(out, filled, 0, used);
      filled += used;
      if (used === chunk.length) this.chunks.shift();
      else this.chunks[0] = chunk.subarray(used);
    }
    return out;
  }
}

/** What START carries; mirrors AgentStartOptions after validation. */
export interface StartRequest {
  argv: string[];
  env: Record<string, string>;
  cwd: string;
  stdin?: boolean;
  pty?: { cols: number; rows: number };
  /**
   * Run as this user of the sandbox ("name", "uid" or "uid:gid", looked up in its /etc/passwd),
   * with its groups, HOME, USER and LOGNAME (unless `env` sets them). Only an agent running as root
   * inside (a sandbox from a template) can. @default the agent's own user
   */
  user?: string;
  /** Opaque to the agent (at most 16 KiB): LIST says it back, so a new host knows what it started. */
  label?: string;
}

function invalid(message: string, details: Record<string, unknown>): SandboxError {
  return new SandboxError('INVALID_ARGUMENT', message, { details });
}

function checkString(value: unknown, field: string): string {
  if (typeof value !== 'string') throw invalid(`${field} must be a string`, { field });
  if (value.includes('\0')) throw invalid(`${field} contains a NUL byte`, { field });
  return value;
}

export function checkTerminalSize(cols: number, rows: number): void {
  for (const [field, value] of [['cols', cols], ['rows', rows]] as const) {
    if (!Number.isInteger(value) || value < 1 || value > 0xffff) {
      throw invalid(`pty ${field} must be an integer from 1 to 65535, got ${value}`, { field, value });
    }
  }
}

function record(tag: string, bytes: Buffer): Buffer {
  const head = Buffer.allocUnsafe(5);
  head.writeUInt8(tag.charCodeAt(0), 0);
  head.writeUInt32BE(bytes.length, 1);
  return Buffer.concat([head, bytes]);
}

/** Validates a start request and encodes the START payload; throws SandboxError('INVALID_ARGUMENT'). */
export function encodeStart(request: StartRequest): Buffer {
  const { argv, env, cwd, stdin, pty, user } = request;
  if (!Array.isArray(argv) || argv.length === 0) throw invalid('argv must be a non-empty array', { field: 'argv' });
  if (argv[0] === '') throw invalid('argv[0] must name a program', { field: 'argv' });
  const records = argv.map((arg, i) => record('a', Buffer.from(checkString(arg, `argv[${i}]`))));
  for (const [key, value] of Object.entries(env)) {
    checkString(value, `env.${key}`);
    if (key === '' || key.includes('=') || key.includes('\0')) {
      throw invalid(`env name ${JSON.stringify(key)} is not valid`, { field: 'env', key });
    }
    records.push(record('e', Buffer.from(`${key}=${value}`)));
  }
  if (!checkString(cwd, 'cwd').startsWith('/')) throw invalid(`cwd must be absolute, got ${JSON.stringify(cwd)}`, { field: 'cwd' });
  records.push(record('c', Buffer.from(cwd)));
  records.push(record('i', Buffer.from([stdin === true ? 1 : 0])));
  if (pty !== undefined) {
    checkTerminalSize(pty.cols, pty.rows);
    records.push(record('t', encodeSize(pty.cols, pty.rows)));
  }
  if (user !== undefined) {
    if (!/^(?:[a-z_][a-z0-9_.-]{0,31}\$?|\d{1,10}(?::\d{1,10})?)$/i.test(user)) {
      throw invalid(`user ${JSON.stringify(user)} is not a user name, uid or uid:gid`, { field: 'user' });
    }
    records.push(record('u', Buffer.from(user)));
  }
  if (request.label !== undefined) {
    const label = Buffer.from(request.label);
    // Past the agent's bound the label is left off: it only improves what a later host shows.
    if (label.length <= MAX_LABEL_BYTES) records.push(record('l', label));
  }
  const payload = Buffer.concat(records);
  if (payload.length > MAX_PAYLOAD_BYTES) {
    throw invalid(`argv and env take ${payload.length} bytes; the limit is 1 MiB`, { payloadBytes: payload.length });
  }
  return payload;
}

function encodeSize(cols: number, rows: number): Buffer {
  const size = Buffer.allocUnsafe(4);
  size.writeUInt16BE(cols, 0);
  size.writeUInt16BE(rows, 2);
  return size;
}

export function encodeResize(cols: number, rows: number): Buffer {
  checkTerminalSize(cols, rows);
  return encodeSize(cols, rows);
}

export function encodeSignal(signal: number): Buffer {
  if (!Number.isInteger(signal) || signal < 1 || signal > 64) {
    throw invalid(`signal number must be from 1 to 64, got ${signal}`, { field: 'signal', value: signal });
  }
  return Buffer.from([signal]);
}

function needBytes(payload: Buffer, n: number, what: string): void {
  if (payload.length < n) throw new SandboxError('INTERNAL', `agent sent a short ${what} frame (${payload.length} bytes)`);
}

export function decodeStarted(payload: Buffer): { pid: number } {
  needBytes(payload, 4, 'STARTED');
  return { pid: payload.readUInt32BE(0) };
}

export function decodeStartFailed(payload: Buffer): { errno: number; message: string } {
  needBytes(payload, 4, 'START_FAILED');
  return { errno: payload.readInt32BE(0), message: payload.subarray(4).toString('utf8') };
}

export function decodeExit(payload: Buffer): { kind: 'exited' | 'signaled'; value: number } {
  needBytes(payload, 5, 'EXIT');
  return { kind: payload.readUInt8(0) === 1 ? 'signaled' : 'exited', value: payload.readInt32BE(1) };
}

export function encodeRelayOpen(port: number): Buffer {
  if (!Number.isInteger(port) || port < 1 || port > 65_535) {
    throw invalid(`port must be an integer from 1 to 65535, got ${port}`, { field: 'port', value: port });
  }
  const payload = Buffer.allocUnsafe(2);
  payload.writeUInt16BE(port, 0);
  return payload;
}

export function encodeU32(value: number): Buffer {
  const payload = Buffer.allocUnsafe(4);
  payload.writeUInt32BE(value, 0);
  return payload;
}

/** 'p': errno 0 when connected, else the errno and the agent's message. */
export function decodeRelayOpened(payload: Buffer): { errno: number; message: string } {
  needBytes(payload, 4, 'RELAY_OPENED');
  return { errno: payload.readInt32BE(0), message: payload.subarray(4).toString('utf8') };
}

/** 'z': `eof` when the socket's input ended (a half close), else the errno that ended the relay. */
export function decodeRelayClosed(payload: Buffer): { eof: true } | { eof: false; errno: number } {
  needBytes(payload, 1, 'RELAY_CLOSED');
  if (payload.readUInt8(0) === 1) return { eof: true };
  return { eof: false, errno: payload.length >= 5 ? payload.readInt32BE(1) : 0 };
}

export function decodeU32(payload: Buffer, what: string): number {
  needBytes(payload, 4, what);
  return payload.readUInt32BE(0);
}

/** One process in a LIST answer: running, or one of the last that ended with how it ended. */
export interface ListedProcess {
  id: number;
  pid: number;
  isPty: boolean;
  hasStdin: boolean;
  exit?: { kind: 'exited' | 'signaled'; value: number };
  label: string;
}

/** A LIST_REPLY frame: its processes and whether another frame of the same answer follows. */
export function decodeListReply(payload: Buffer): { more: boolean; processes: ListedProcess[] } {
  needBytes(payload, 1, 'LIST_REPLY');
  const processes: ListedProcess[] = [];
  let offset = 1;
  while (offset < payload.length) {
    needBytes(payload.subarray(offset), 19, 'LIST_REPLY record');
    const labelBytes = payload.readUInt32BE(offset + 15);
    needBytes(payload.subarray(offset + 19), labelBytes, 'LIST_REPLY label');
    const flags = payload.readUInt8(offset + 9);
    const ended = payload.readUInt8(offset) === 1;
    processes.push({
      id: payload.readUInt32BE(offset + 1),
      pid: payload.readUInt32BE(offset + 5),
      isPty: (flags & 1) !== 0,
      hasStdin: (flags & 2) !== 0,
      ...(ended ? { exit: { kind: payload.readUInt8(offset + 10) === 1 ? ('signaled' as const) : ('exited' as const), value: payload.readInt32BE(offset + 11) } } : {}),
      label: payload.subarray(offset + 19, offset + 19 + labelBytes).toString('utf8'),
    });
    offset += 19 + labelBytes;
  }
  return { more: payload.readUInt8(0) === 1, processes };
}

export function decodeDropped(payload: Buffer): number {
  needBytes(payload, 8, 'DROPPED');
  return Number(payload.readBigUInt64BE(0));
}
