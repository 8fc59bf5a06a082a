import type { CodeResult, ExecutionError, InterpreterLanguage } from '../../wire/index.js';

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
  onResult?: (result: CodeResult) => void;
  onError?: (error: ExecutionError) => void;
  /** Aborting interrupts the code like a timeout does and rejects with ABORTED. */
  signal?: AbortSignal;
}
