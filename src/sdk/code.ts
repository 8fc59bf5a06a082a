import { ConnectionError, errorFromStreamEvent } from './errors.js';
import { callOptions, type HttpClient } from './http.js';
import { readNdjson } from './ndjson.js';
import type { CallOptions } from './types.js';

// The wire contract's types (type-only: the SDK loads no zod schema at run time). `Result` is the
// name E2B's SDK gives a rich output.
import type { CodeEvent, CodeResult as Result, CodeRunOptions, ContextInfo, ContextOptions, Execution, ExecutionError, InterpreterLanguage } from '../wire/index.js';
export type { ContextInfo, Execution, ExecutionError, InterpreterLanguage, Result };

export interface RunCodeOptions extends CodeRunOptions {
  /** Deadline for the server to accept the call (not for the code). @default 60000 */
  requestTimeoutMs?: number;
}

export interface CreateContextOptions extends CallOptions, ContextOptions {}

/** Runs code in an interpreter context of the sandbox at `base`; see `Sandbox.runCode`. */
export async function runCode(http: HttpClient, base: string, code: string, options: RunCodeOptions = {}): Promise<Execution> {
  const open = await http.open({
    method: 'POST',
    path: `${base}/code`,
    json: { code, contextId: options.contextId, language: options.language, envVars: options.envVars, timeoutMs: options.timeoutMs },
    timeoutMs: options.requestTimeoutMs,
    signal: options.signal,
  });
  let execution: Execution | undefined;
  try {
    for await (const event of readNdjson<CodeEvent>(open.chunks())) {
      switch (event.type) {
        case 'stdout':
          options.onStdout?.(event.text);
          break;
        case 'stderr':
          options.onStderr?.(event.text);
          break;
        case 'result':
          options.onResult?.(event.result);
          break;
        case 'error':
          if ('code' in event.error) throw errorFromStreamEvent(event.error);
          options.onError?.(event.error);
          break;
        case 'end':
          execution = event.execution;
          return execution;
        default:
          break;
      }
    }
  } finally {
    // After the end event the server ends the stream: its connection is kept for the next call.
    if (execution) open.finish();
    else open.close();
  }
  throw new ConnectionError('SERVER_UNREACHABLE', 'the code stream ended before its end event', {
    hint: 'The connection broke or the server restarted; the context may have run the code. Check its state before running it again.',
  });
}

/**
 * The interpreter contexts of one sandbox. Each keeps its variables, imports and definitions
 * between `runCode` calls; contexts do not share state.
 */
export class Contexts {
  constructor(
    private readonly http: HttpClient,
    private readonly base: string,
  ) {}

  /** Starts a context (Python: an IPython kernel; js/ts: a Node REPL context). */
  async create(options: CreateContextOptions = {}): Promise<ContextInfo> {
    const json = { language: options.language, cwd: options.cwd, envVars: options.envVars };
    return this.http.json<ContextInfo>({ method: 'POST', path: `${this.base}/contexts`, json, ...callOptions(options) });
  }

  async list(options: CallOptions = {}): Promise<ContextInfo[]> {
    return (await this.http.json<{ contexts: ContextInfo[] }>({ method: 'GET', path: `${this.base}/contexts`, ...callOptions(options) })).contexts;
  }

  /** A fresh interpreter in the same context: its state is gone (also the way back after a memory limit). */
  async restart(contextId: string, options: CallOptions = {}): Promise<void> {
    await this.http.json({ method: 'POST', path: `${this.path(contextId)}/restart`, ...callOptions(options) });
  }

  async delete(contextId: string, options: CallOptions = {}): Promise<void> {
    await this.http.json({ method: 'DELETE', path: this.path(contextId), ...callOptions(options) });
  }

  private path(contextId: string): string {
    return `${this.base}/contexts/${encodeURIComponent(contextId)}`;
  }
}
