import type { CodeRunOptions, ContextOptions } from '../../wire/index.js';

export interface CreateContextOptions extends ContextOptions {
  /** How long the interpreter may take to start. @default 60000 */
  timeoutMs?: number;
  signal?: AbortSignal;
}

export type RunCodeOptions = CodeRunOptions;
