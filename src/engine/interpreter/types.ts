import type { LimitHit } from '../result.js';

/** Languages an interpreter context can run. `ts` is TypeScript with its types stripped. */
export const INTERPRETER_LANGUAGES = ['python', 'js', 'ts'] as const;
export type InterpreterLanguage = (typeof INTERPRETER_LANGUAGES)[number];

/**
 * One rich output of an execution, by MIME type: the last expression's value (`isMainResult`)
 * or something displayed along the way (a plot, `display(df)`). Images are base64.
 */
export interface Result {
  isMainResult: boolean;
  text?: string;
  html?: string;
  markdown?: string;
  svg?: string;
  /** Base64-encoded PNG. */
  png?: string;
  /** Base64-encoded JPEG. */
  jpeg?: string;
  json?: unknown;
  latex?: string;
  javascript?: string;
  /** MIME types without a field of their own, as the kernel sent them. */
  extra?: Record<string, unknown>;
}

/** An exception the code raised (or the interrupt that ended it). */
export interface ExecutionError {
  /** Exception class, e.g. `ZeroDivisionError`, `TypeError`, `KeyboardInterrupt`. */
  name: string;
  value: string;
  traceback: string;
}

/** What one `runCode` produced. The code's own exception is `error`; a limit that ended it is `limit`. */
export interface Execution {
  results: Result[];
  /** Output in the chunks it arrived in. */
  stdout: string[];
  stderr: string[];
  error?: ExecutionError;
  executionCount?: number;
  /** Set when a limit ended the code: `wall_clock` (timeoutMs) or `memory` (the context was killed). */
  limit?: LimitHit;
  /** True when output past the sandbox's stdoutBytes/stderrBytes was dropped. */
  stdoutTruncated?: boolean;
  stderrTruncated?: boolean;
  /** The context the code ran in. */
  contextId: string;
}

export interface ContextInfo {
  id: string;
  language: InterpreterLanguage;
  /** Working directory of the context inside the sandbox. */
  cwd: string;
}

export interface CreateContextOptions {
  /** @default 'python' */
  language?: InterpreterLanguage;
  /** Working directory inside the sandbox. @default spec.cwd */
  cwd?: string;
  /** Environment of the context for its whole life, on top of the spec's. */
  envVars?: Record<string, string>;
  /** How long the interpreter may take to start. @default 60000 */
  timeoutMs?: number;
  signal?: AbortSignal;
}

export interface RunCodeOptions {
  /** The context to run in. Without it, `language`'s default context (created on first use). */
  contextId?: string;
  /** @default 'python' */
  language?: InterpreterLanguage;
  /** Environment variables for this call only: set before the code runs, restored after. */
  envVars?: Record<string, string>;
  /** Wall-clock limit of this call; the code is interrupted, the context keeps its state. @default spec.limits.wallClockMs */
  timeoutMs?: number;
  onStdout?: (text: string) => void;
  onStderr?: (text: string) => void;
  onResult?: (result: Result) => void;
  onError?: (error: ExecutionError) => void;
  /** Aborting interrupts the code like a timeout does and rejects with ABORTED. */
  signal?: AbortSignal;
}
