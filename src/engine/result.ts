/** How an exec or run ended. A limit hit is not a crash and not the program's own failure. */
export type Outcome = 'ok' | 'exit_nonzero' | 'limit_exceeded' | 'error';

export const LIMIT_RESOURCES = ['wall_clock', 'memory', 'pids', 'disk', 'file_size', 'output', 'cpu', 'egress'] as const;
export type LimitResource = (typeof LIMIT_RESOURCES)[number];

/** The limit that ended the work: which, its value, what was used, and what to change. */
export interface LimitHit {
  resource: LimitResource;
  limit: number;
  /** What was used when the limit ended the work, in the limit's unit; null when unknown. */
  used: number | null;
  unit: 'bytes' | 'ms' | 'count';
  message: string;
}

export interface Warning {
  resource: 'memory';
  limit: number;
  used: number;
  message: string;
}

export interface Usage {
  memoryPeakBytes: number;
  cpuTimeMs: number;
  cpuThrottledMs: number;
  diskUsedBytes: number | null;
}

export interface ExecResult {
  outcome: Outcome;
  exitCode: number | null;
  signal: string | null;
  /**
   * The kept stdout (the first `limits.stdoutBytes`). In results of the server's processes at most
   * the first `RESULT_INLINE_BYTES` of it: see `stdoutInlineTruncated`.
   */
  stdout: string;
  stderr: string;
  /** The process wrote more than the cap: the rest was not kept (`stdoutBytes` counts it). */
  stdoutTruncated: boolean;
  stderrTruncated: boolean;
  /**
   * Set (true) when `stdout` holds only the first `RESULT_INLINE_BYTES` (1 MiB) of the kept stdout:
   * a result never carries more inline. The process's events (a reattach replays them) and its
   * log hold all of it; the SDK rebuilds the whole kept stdout from the events it received.
   */
  stdoutInlineTruncated?: boolean;
  stderrInlineTruncated?: boolean;
  /** Bytes the process wrote, including the part that was dropped. */
  stdoutBytes: number;
  stderrBytes: number;
  durationMs: number;
  usage: Usage;
  limit?: LimitHit;
  warnings: Warning[];
  /** Set when outcome is `error`: the sandbox crashed or the process could not start. */
  error?: { code: string; message: string };
  /**
   * Set when outcome is not `ok`: a short account of where it failed, the key parameters and the
   * last lines of stderr (at most 20 lines / 2 KiB). The full output is in the process's log.
   */
  diagnostic?: string;
}

/** How a process ended, without its output: what the server keeps in memory for an ended process. */
export type ProcessEnd = Omit<ExecResult, 'stdout' | 'stderr'>;

/** Bytes of each stream a result carries inline at most (the rest stays on disk, in the log). */
export const RESULT_INLINE_BYTES = 1024 * 1024;

export const DIAGNOSTIC_TAIL_LINES = 20;
export const DIAGNOSTIC_TAIL_BYTES = 2048;

/** The last bytes of a stream, whatever the output caps kept of its start. */
export class TailBuffer {
  private chunks: Buffer[] = [];
  private size = 0;

  constructor(private readonly maxBytes = DIAGNOSTIC_TAIL_BYTES) {}

  push(chunk: Buffer): void {
    this.chunks.push(chunk);
    this.size += chunk.length;
    while (this.chunks.length > 1 && this.size - (this.chunks[0]?.length ?? 0) >= this.maxBytes) {
      this.size -= this.chunks.shift()?.length ?? 0;
    }
  }

  /** The last complete lines that fit, at most `DIAGNOSTIC_TAIL_LINES`. */
  lines(): string[] {
    const all = Buffer.concat(this.chunks);
    const tail = all.subarray(Math.max(0, all.length - this.maxBytes));
    const lines = tail.toString('utf8').split('\n');
    if (tail.length < all.length) lines.shift(); // the first line was cut
    while (lines.length > 0 && lines[lines.length - 1]?.trim() === '') lines.pop();
    return lines.slice(-DIAGNOSTIC_TAIL_LINES);
  }
}

/** Where and how an exec failed, for the result's error fields; undefined when it succeeded. */
export function diagnose(result: ExecResult, request: { argv: readonly string[]; cwd?: string }, stderrTail: string[]): string | undefined {
  if (result.outcome === 'ok') return undefined;
  const command = request.argv.map((arg) => (arg.length > 60 ? `${arg.slice(0, 57)}...` : arg)).join(' ').slice(0, 200);
  const how =
    result.outcome === 'limit_exceeded' ? (result.limit?.message ?? 'a limit was exceeded')
    : result.outcome === 'error' ? `${result.error?.code ?? 'error'}: ${result.error?.message ?? ''}`
    : result.signal ? `killed by ${result.signal}` : `exit code ${result.exitCode}`;
  const where = `\`${command}\` in ${request.cwd ?? '/workspace'} ended after ${result.durationMs} ms: ${how}`;
  if (stderrTail.length === 0) return where;
  return `${where}\nlast stderr lines:\n${stderrTail.join('\n')}`;
}
