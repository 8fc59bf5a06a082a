import { z } from 'zod';
import { USER_REF } from '../sandbox-spec/index.js';
import { EnvName, MAX_PATH_LENGTH, noNul, SANDBOX_ID_PATTERN } from './common.js';

/** How an exec or run ended. A limit hit is not a crash and not the program's own failure. */
export const OUTCOMES = ['ok', 'exit_nonzero', 'limit_exceeded', 'error'] as const;
export const LIMIT_RESOURCES = ['wall_clock', 'memory', 'pids', 'disk', 'file_size', 'output', 'cpu', 'egress'] as const;

/** The limit that ended the work: which, its value, what was used, and what to change. */
export const LimitHitSchema = z.object({
  resource: z.enum(LIMIT_RESOURCES),
  limit: z.number(),
  /** What was used when the limit ended the work, in the limit's unit; null when unknown. */
  used: z.number().nullable(),
  unit: z.enum(['bytes', 'ms', 'count']),
  message: z.string(),
});

export const WarningSchema = z.object({ resource: z.literal('memory'), limit: z.number(), used: z.number(), message: z.string() });

export const UsageSchema = z.object({
  memoryPeakBytes: z.number(),
  cpuTimeMs: z.number(),
  cpuThrottledMs: z.number(),
  diskUsedBytes: z.number().nullable(),
});

/** A wire error inside a result or a stream: a code of src/errors and its message. */
export const InlineErrorSchema = z.object({ code: z.string(), message: z.string() });

export const ExecResultSchema = z.object({
  outcome: z.enum(OUTCOMES),
  exitCode: z.number().int().nullable(),
  signal: z.string().nullable(),
  stdout: z.string(),
  stderr: z.string(),
  stdoutTruncated: z.boolean(),
  stderrTruncated: z.boolean(),
  /**
   * Set (true) when `stdout` holds only the first 1 MiB of the kept stdout: a result never carries
   * more inline. The process's events (a reattach replays them) and its log hold all of it; the
   * SDK rebuilds the whole kept stdout from the events it received.
   */
  stdoutInlineTruncated: z.boolean().optional(),
  stderrInlineTruncated: z.boolean().optional(),
  /** Bytes the process wrote, including the part that was dropped. */
  stdoutBytes: z.number(),
  stderrBytes: z.number(),
  durationMs: z.number(),
  usage: UsageSchema,
  limit: LimitHitSchema.optional(),
  warnings: z.array(WarningSchema),
  /** Set when outcome is `error`: the sandbox crashed or the process could not start. */
  error: InlineErrorSchema.optional(),
  /**
   * Set when outcome is not `ok`: a short account of where it failed, the key parameters and the
   * last lines of stderr (at most 20 lines / 2 KiB). The full output is in the process's log.
   */
  diagnostic: z.string().optional(),
});

export const ProcessInfoSchema = z.object({
  pid: z.number().int(),
  argv: z.array(z.string()),
  cwd: z.string(),
  tag: z.string().optional(),
  running: z.boolean(),
  startedAt: z.string(),
});

export const SIGNALS = ['SIGTERM', 'SIGKILL', 'SIGINT', 'SIGHUP', 'SIGQUIT', 'SIGUSR1', 'SIGUSR2', 'SIGSTOP', 'SIGCONT', 'SIGWINCH'] as const;

export const PtySizeSchema = z.strictObject({ cols: z.number().int().min(1).max(1000), rows: z.number().int().min(1).max(1000) });

export const ProcessParams = z.strictObject({
  sandboxId: z.string().regex(SANDBOX_ID_PATTERN),
  pid: z.string().regex(/^[1-9][0-9]{0,9}$/, 'must be a process id').transform(Number),
});

export const StartProcessBody = z.strictObject({
  argv: z.array(noNul).min(1).max(4096),
  cwd: noNul.pipe(z.string().min(1).max(MAX_PATH_LENGTH)).optional(),
  env: z.record(EnvName, noNul).optional(),
  timeoutMs: z.number().int().positive().optional(),
  stdin: z.boolean().optional(),
  background: z.boolean().optional(),
  tag: z.string().max(256).optional(),
  /** `root`, or a user name, uid or uid:gid of the template. @default the sandbox's user */
  user: z.string().regex(USER_REF, 'must be a user name, a uid or uid:gid').optional(),
  pty: PtySizeSchema.optional(),
  /** After the exit, collect this directory: the foreground exit result carries `artifacts`. */
  collectArtifacts: z.strictObject({ dir: z.string().min(1).max(MAX_PATH_LENGTH).optional() }).optional(),
});

export const SignalBody = z.strictObject({ signal: z.enum(SIGNALS) });

export type Outcome = (typeof OUTCOMES)[number];
export type LimitResource = (typeof LIMIT_RESOURCES)[number];
export type LimitHit = z.output<typeof LimitHitSchema>;
export type Warning = z.output<typeof WarningSchema>;
export type Usage = z.output<typeof UsageSchema>;
export type ExecResult = z.output<typeof ExecResultSchema>;
export type ProcessInfo = z.output<typeof ProcessInfoSchema>;
export type ProcessSignal = (typeof SIGNALS)[number];
export type StartProcessRequest = z.input<typeof StartProcessBody>;
