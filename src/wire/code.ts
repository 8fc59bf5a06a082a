import { z } from 'zod';
import { EnvName, noNul, SANDBOX_ID_PATTERN } from './common.js';
import { INTERPRETER_LANGUAGES } from './constants.js';
import { InlineErrorSchema, LimitHitSchema } from './process.js';


/**
 * One rich output of an execution, by MIME type: the last expression's value (`isMainResult`)
 * or something displayed along the way (a plot, `display(df)`). Images are base64.
 */
export const CodeResultSchema = z.object({
  isMainResult: z.boolean(),
  text: z.string().optional(),
  html: z.string().optional(),
  markdown: z.string().optional(),
  svg: z.string().optional(),
  /** Base64-encoded PNG. */
  png: z.string().optional(),
  /** Base64-encoded JPEG. */
  jpeg: z.string().optional(),
  json: z.unknown().optional(),
  latex: z.string().optional(),
  javascript: z.string().optional(),
  /** MIME types without a field of their own, as the kernel sent them. */
  extra: z.record(z.string(), z.unknown()).optional(),
});

/** An exception the code raised (or the interrupt that ended it). */
export const ExecutionErrorSchema = z.object({
  /** Exception class, e.g. `ZeroDivisionError`, `TypeError`, `KeyboardInterrupt`. */
  name: z.string(),
  value: z.string(),
  traceback: z.string(),
});

/** What one `runCode` produced. The code's own exception is `error`; a limit that ended it is `limit`. */
export const ExecutionSchema = z.object({
  results: z.array(CodeResultSchema),
  /** Output in the chunks it arrived in. */
  stdout: z.array(z.string()),
  stderr: z.array(z.string()),
  error: ExecutionErrorSchema.optional(),
  executionCount: z.number().int().optional(),
  /** Set when a limit ended the code: `wall_clock` (timeoutMs) or `memory` (the context was killed). */
  limit: LimitHitSchema.optional(),
  /** True when output past the sandbox's stdoutBytes/stderrBytes was dropped. */
  stdoutTruncated: z.boolean().optional(),
  stderrTruncated: z.boolean().optional(),
  /** The context the code ran in. */
  contextId: z.string(),
});

const Language = z.enum(INTERPRETER_LANGUAGES);

export const ContextInfoSchema = z.object({
  id: z.string(),
  language: Language,
  /** Working directory of the context inside the sandbox. */
  cwd: z.string(),
});

/** Context ids as the interpreter makes them: `py-`, `js-` or `ts-` and 12 hex digits. */
export const ContextIdSchema = z.string().regex(/^(py|js|ts)-[0-9a-f]{12}$/, 'must be a context id');

const EnvVars = z.record(EnvName, noNul);

export const RunCodeBody = z.strictObject({
  code: z.string(),
  /** The context to run in; without it, the default context of `language`. */
  contextId: ContextIdSchema.optional(),
  /** @default 'python' */
  language: Language.optional(),
  /** Environment variables for this call only: set before the code runs, restored after. */
  envVars: EnvVars.optional(),
  /** Wall-clock limit of this call; the code is interrupted, the context keeps its state. */
  timeoutMs: z.number().int().positive().max(2 ** 31 - 1).optional(),
});

export const CreateContextBody = z.strictObject({
  language: Language.optional(),
  cwd: z.string().min(1).max(4096).optional(),
  envVars: EnvVars.optional(),
});

export const ContextParams = z.strictObject({ sandboxId: z.string().regex(SANDBOX_ID_PATTERN), contextId: ContextIdSchema });

/** One line of a `POST /code` stream. */
export const CodeEventSchema = z.discriminatedUnion('type', [
  z.object({ type: z.literal('stdout'), text: z.string() }),
  z.object({ type: z.literal('stderr'), text: z.string() }),
  z.object({ type: z.literal('result'), result: CodeResultSchema }),
  /** The code's exception, or (with `code`) the server failing mid-stream. */
  z.object({ type: z.literal('error'), error: z.union([ExecutionErrorSchema, InlineErrorSchema.extend({ requestId: z.string().optional() })]) }),
  z.object({ type: z.literal('executionCount'), count: z.number().int() }),
  z.object({ type: z.literal('end'), execution: ExecutionSchema }),
]);

export type InterpreterLanguage = (typeof INTERPRETER_LANGUAGES)[number];
export type CodeResult = z.output<typeof CodeResultSchema>;
export type ExecutionError = z.output<typeof ExecutionErrorSchema>;
export type Execution = z.output<typeof ExecutionSchema>;
export type ContextInfo = z.output<typeof ContextInfoSchema>;
export type CodeEvent = z.output<typeof CodeEventSchema>;

/** What a code run takes besides the code, on every surface that runs one (engine, SDK). */
export interface CodeRunOptions {
  /** The context to run in. Without it, `language`'s default context (created on first use). */
  contextId?: string;
  /** @default 'python' */
  language?: InterpreterLanguage;
  /** Environment variables for this call only: set before the code runs, restored after. */
  envVars?: Record<string, string>;
  /**
   * Wall-clock limit of the code: past it the code is interrupted, the context keeps its earlier
   * state, and the execution has `limit.resource: 'wall_clock'`. @default spec.limits.wallClockMs
   */
  timeoutMs?: number;
  onStdout?: (text: string) => void;
  onStderr?: (text: string) => void;
  /** A rich result: the last expression's value (`isMainResult`) or displayed data (a plot). */
  onResult?: (result: CodeResult) => void;
  /** The exception the code raised. */
  onError?: (error: ExecutionError) => void;
  /** Aborting interrupts the code (the context keeps its state) and rejects with ABORTED. */
  signal?: AbortSignal;
}

/** What a new context takes. */
export interface ContextOptions {
  /** @default 'python' */
  language?: InterpreterLanguage;
  /** Working directory inside the sandbox. @default spec.cwd ('/workspace') */
  cwd?: string;
  /** Environment of the context for its whole life, on top of the spec's. */
  envVars?: Record<string, string>;
}
