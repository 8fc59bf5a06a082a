/** How an exec or run ended. A limit hit is not a crash and not the program's own failure. */
export type Outcome = 'ok' | 'exit_nonzero' | 'limit_exceeded' | 'error';

export const LIMIT_RESOURCES = ['wall_clock', 'memory', 'pids', 'disk', 'file_size', 'output', 'cpu'] as const;
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
  stdout: string;
  stderr: string;
  stdoutTruncated: boolean;
  stderrTruncated: boolean;
  /** Bytes the process wrote, including the part that was dropped. */
  stdoutBytes: number;
  stderrBytes: number;
  durationMs: number;
  usage: Usage;
  limit?: LimitHit;
  warnings: Warning[];
  /** Set when outcome is `error`: the sandbox crashed or the process could not start. */
  error?: { code: string; message: string };
}
