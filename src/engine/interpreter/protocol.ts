/**
 * The NDJSON protocol between the host and an interpreter driver (native/sandbox-tools/*_driver.*):
 * one JSON object per line each way. Pure code: decoding lines and folding events into an
 * Execution, so both are unit-tested without a sandbox.
 */
import type { CodeResult, Execution, ExecutionError } from '../../wire/index.js';

export type DriverRequest =
  | { op: 'execute'; id: string; code: string; envVars?: Record<string, string> }
  /** With `id`, only that execution is interrupted (a late request must not hit the next one). */
  | { op: 'interrupt'; id?: string }
  | { op: 'restart' }
  | { op: 'shutdown' };

/** How the driver says an execution ended. */
export type EndOutcome = 'idle' | 'interrupted' | 'died' | 'restarted' | 'shutdown';

export type DriverEvent =
  | { type: 'ready' }
  | { type: 'restarted' }
  | { type: 'fatal'; message: string }
  | { type: 'stdout' | 'stderr'; id: string; text: string }
  | ({ type: 'result'; id: string } & CodeResult)
  | ({ type: 'error'; id: string } & ExecutionError)
  | { type: 'executionCount'; id: string; count: number }
  | { type: 'died'; id: string }
  | { type: 'end'; id: string; outcome: EndOutcome };

const RESULT_FIELDS = ['text', 'html', 'markdown', 'svg', 'png', 'jpeg', 'latex', 'javascript'] as const;

/** Splits a byte stream into lines; a partial line waits for its newline. */
export class LineDecoder {
  private pending = '';
  private readonly decoder = new TextDecoder('utf-8');

  push(chunk: Uint8Array): string[] {
    this.pending += this.decoder.decode(chunk, { stream: true });
    const lines = this.pending.split('\n');
    this.pending = lines.pop() ?? '';
    return lines.filter((line) => line.trim() !== '');
  }
}

/** Parses one driver line; throws on a line that is not a known event. */
export function parseEvent(line: string): DriverEvent {
  const raw = JSON.parse(line) as unknown;
  if (raw === null || typeof raw !== 'object' || typeof (raw as { type?: unknown }).type !== 'string') {
    throw new Error(`not a driver event: ${line.slice(0, 200)}`);
  }
  const event = raw as Record<string, unknown> & { type: string };
  const id = typeof event.id === 'string' ? event.id : '';
  switch (event.type) {
    case 'ready':
    case 'restarted':
      return { type: event.type };
    case 'fatal':
      return { type: 'fatal', message: str(event.message, 'unknown driver failure') };
    case 'stdout':
    case 'stderr':
      return { type: event.type, id, text: str(event.text) };
    case 'result':
      return { type: 'result', id, ...toResult(event) };
    case 'error':
      return {
        type: 'error',
        id,
        name: str(event.name, 'Error'),
        value: str(event.value),
        traceback: str(event.traceback),
      };
    case 'executionCount':
      return { type: 'executionCount', id, count: Number(event.count) };
    case 'died':
      return { type: 'died', id };
    case 'end':
      return { type: 'end', id, outcome: toOutcome(event.outcome) };
    default:
      throw new Error(`unknown driver event type ${JSON.stringify(event.type)}`);
  }
}

function str(value: unknown, fallback = ''): string {
  return typeof value === 'string' ? value : fallback;
}

function toResult(event: Record<string, unknown>): CodeResult {
  const result: CodeResult = { isMainResult: event.isMainResult === true };
  for (const field of RESULT_FIELDS) {
    const value = event[field];
    if (typeof value === 'string') result[field] = value;
  }
  if (event.json !== undefined) result.json = event.json;
  if (event.extra !== null && typeof event.extra === 'object') result.extra = event.extra as Record<string, unknown>;
  return result;
}

function toOutcome(value: unknown): EndOutcome {
  const outcomes: readonly EndOutcome[] = ['idle', 'interrupted', 'died', 'restarted', 'shutdown'];
  return outcomes.includes(value as EndOutcome) ? (value as EndOutcome) : 'idle';
}

export interface ExecutionCaps {
  stdoutBytes: number;
  stderrBytes: number;
}

export interface ExecutionListeners {
  onStdout?: (text: string) => void;
  onStderr?: (text: string) => void;
  onResult?: (result: CodeResult) => void;
  onError?: (error: ExecutionError) => void;
}

/** Folds the events of one execution into an Execution, keeping output up to the caps. */
export class ExecutionBuilder {
  readonly execution: Execution;
  private stdoutBytes = 0;
  private stderrBytes = 0;

  constructor(
    contextId: string,
    private readonly caps: ExecutionCaps,
    private readonly listeners: ExecutionListeners = {},
  ) {
    this.execution = { contextId, results: [], stdout: [], stderr: [] };
  }

  /** Applies one event of this execution. */
  apply(event: DriverEvent): void {
    switch (event.type) {
      case 'stdout':
      case 'stderr':
        this.output(event.type, event.text);
        return;
      case 'result': {
        const { type: _type, id: _id, ...result } = event;
        this.execution.results.push(result);
        this.listeners.onResult?.(result);
        return;
      }
      case 'error': {
        const { type: _type, id: _id, ...error } = event;
        this.execution.error = error;
        this.listeners.onError?.(error);
        return;
      }
      case 'executionCount':
        if (Number.isFinite(event.count)) this.execution.executionCount = event.count;
        return;
      default:
        return;
    }
  }

  /** Output that did not come through the kernel (a subprocess writing to the driver's fds). */
  output(stream: 'stdout' | 'stderr', text: string): void {
    const size = Buffer.byteLength(text);
    const cap = stream === 'stdout' ? this.caps.stdoutBytes : this.caps.stderrBytes;
    const used = stream === 'stdout' ? this.stdoutBytes : this.stderrBytes;
    if (stream === 'stdout') this.stdoutBytes += size;
    else this.stderrBytes += size;
    const room = cap - used;
    if (room < size) this.execution[stream === 'stdout' ? 'stdoutTruncated' : 'stderrTruncated'] = true;
    if (room <= 0) return;
    const kept = room >= size ? text : Buffer.from(text).subarray(0, room).toString('utf8');
    this.execution[stream].push(kept);
    if (stream === 'stdout') this.listeners.onStdout?.(kept);
    else this.listeners.onStderr?.(kept);
  }
}
