import type { CodeRunOptions, ContextInfo, ContextOptions } from '../../wire/index.js';

export interface CreateContextOptions extends ContextOptions {
  /** How long the interpreter may take to start. @default 60000 */
  timeoutMs?: number;
  signal?: AbortSignal;
}

export type RunCodeOptions = CodeRunOptions;

/**
 * A context as a full snapshot keeps it: its driver process (the agent's process id) goes on in
 * every sandbox restored from the snapshot, where a context of the same id takes it over.
 */
export interface ContextSnapshot {
  info: ContextInfo;
  /** The driver's environment, for a restart of the context in a restored sandbox. */
  env: Record<string, string>;
  /** `AgentProcess.id` of its driver. */
  processId: number;
  /** It is the default context of its language (what runCode without contextId uses). */
  isDefault: boolean;
  /**
   * Executions the host had sent it: a restored context numbers its next ones after these, so
   * events of one still running in the image (the context was busy) are never taken for a new one's.
   */
  sequence: number;
}
