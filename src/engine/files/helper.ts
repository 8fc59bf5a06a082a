import { SandboxError, isSandboxError } from '../../errors/index.js';
import type { AgentExit, AgentProcess } from '../../backends/agent/index.js';
import type { BackendSandbox, ExecRequest } from '../../backends/backend.js';
import type { FileOperation, HelperFailure } from './errors.js';

/**
 * Every file operation runs as a helper process inside the sandbox: its uid, mount namespace and
 * seccomp filter decide what a path means, so no host path is ever opened on the sandbox's behalf.
 * The C locale keeps error texts stable for classification.
 */
const HELPER_ENV: Record<string, string> = { PATH: '/usr/bin:/bin', LC_ALL: 'C', HOME: '/workspace' };
/** Stderr kept for classifying a failure: the tail is where the errno text is. */
const STDERR_KEEP_BYTES = 16 * 1024;

export function helperRequest(argv: string[], stdin = false): ExecRequest {
  return { argv, env: HELPER_ENV, cwd: '/', stdin };
}

/** `sh -c script sh args...`: the script is a constant, every path is a positional argument. */
export function shArgv(script: string, ...args: string[]): string[] {
  return ['sh', '-c', script, 'sh', ...args];
}

export interface GuardOptions {
  operation: FileOperation;
  path: string;
  /** Kill the helper after this long, or after this long without progress when `touch()` is used. */
  timeoutMs: number;
  signal?: AbortSignal | undefined;
  /** Send SIGTERM first (so the helper can clean up), SIGKILL after TERM_GRACE_MS. @default false */
  terminateFirst?: boolean;
}

const TERM_GRACE_MS = 2000;

/** SIGKILL, or SIGTERM first so that the helper can clean up, and SIGKILL after a grace period. */
function stopHelper(proc: AgentProcess, terminateFirst: boolean): void {
  if (!terminateFirst) {
    proc.signal('SIGKILL');
    return;
  }
  proc.signal('SIGTERM');
  const timer = setTimeout(() => proc.signal('SIGKILL'), TERM_GRACE_MS);
  void proc.exited.then(() => clearTimeout(timer));
}

/**
 * Kills a helper on timeout or abort and remembers which, so the caller can report it. With
 * `touch()` the timeout is an idle timeout: a long transfer that keeps moving is never cut.
 */
export class HelperGuard {
  ended: 'timeout' | 'aborted' | undefined;
  private timer: NodeJS.Timeout | undefined;
  private readonly onAbort = (): void => this.kill('aborted');

  constructor(
    private readonly proc: AgentProcess,
    private readonly options: GuardOptions,
  ) {
    this.touch();
    if (options.signal?.aborted) this.kill('aborted');
    else options.signal?.addEventListener('abort', this.onAbort, { once: true });
  }

  touch(): void {
    if (this.ended !== undefined) return;
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.kill('timeout'), this.options.timeoutMs);
  }

  dispose(): void {
    clearTimeout(this.timer);
    this.options.signal?.removeEventListener('abort', this.onAbort);
  }

  kill(reason: 'timeout' | 'aborted'): void {
    if (this.ended !== undefined) return;
    this.ended = reason;
    this.dispose();
    stopHelper(this.proc, this.options.terminateFirst === true);
  }

  /** The error for how the guard ended the helper, if it did. */
  error(): SandboxError | undefined {
    const { operation, path, timeoutMs } = this.options;
    if (this.ended === 'aborted') {
      return new SandboxError('ABORTED', `${operation} of ${path} was aborted by the caller; the helper process was killed`, {
        details: { path, operation },
      });
    }
    if (this.ended === 'timeout') {
      return new SandboxError('TIMEOUT', `${operation} of ${path} made no progress for ${timeoutMs} ms and was stopped`, {
        details: { path, operation, timeoutMs },
        hint: 'Retry; if the sandbox is busy (CPU or disk), wait or raise its limits.',
      });
    }
    return undefined;
  }
}

export function outOfProcesses(sandbox: BackendSandbox, operation: FileOperation, path: string, cause?: unknown): SandboxError {
  const pids = sandbox.spec.limits.pids;
  return new SandboxError('LIMIT_EXCEEDED', `${operation} of ${path}: the sandbox is out of processes (limits.pids = ${pids}), so the file helper could not start`, {
    details: { path, operation, resource: 'pids', limit: pids },
    hint: 'End some processes in the sandbox, or create it with a higher limits.pids.',
    cause,
  });
}

export function lostError(sandboxId: string, operation: FileOperation, path: string): SandboxError {
  return new SandboxError('SANDBOX_CRASHED', `sandbox ${sandboxId} stopped during ${operation} of ${path}`, {
    details: { path, operation, sandboxId },
    hint: 'The sandbox is gone with its files; start a new one.',
  });
}

/**
 * Starts a helper, bounded by the timeout and the signal: a frozen or overloaded sandbox must not
 * hang the caller. A helper that starts after the caller gave up is killed at once.
 */
export async function startHelper(sandbox: BackendSandbox, request: ExecRequest, options: GuardOptions): Promise<AgentProcess> {
  const { operation, path, timeoutMs, signal } = options;
  const aborted = (): SandboxError =>
    new SandboxError('ABORTED', `${operation} of ${path} was aborted by the caller`, { details: { path, operation } });
  if (signal?.aborted) throw aborted();
  const started = sandbox.exec(request);
  let timer: NodeJS.Timeout | undefined;
  let onAbort: (() => void) | undefined;
  const gaveUp = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      reject(
        new SandboxError('TIMEOUT', `${operation} of ${path}: the sandbox did not start its helper within ${timeoutMs} ms`, {
          details: { path, operation, timeoutMs },
          hint: 'The sandbox may be paused or out of processes (limits.pids); resume it or retry.',
        }),
      );
    }, timeoutMs);
    onAbort = () => reject(aborted());
    signal?.addEventListener('abort', onAbort, { once: true });
  });
  try {
    return await Promise.race([started, gaveUp]);
  } catch (error) {
    // Settle only once a helper that started late is gone (bounded: a frozen sandbox never answers).
    const stopped = started.then(
      async (proc) => {
        stopHelper(proc, options.terminateFirst === true);
        await proc.exited;
      },
      () => undefined,
    );
    let wait: NodeJS.Timeout | undefined;
    await Promise.race([stopped, new Promise<void>((resolve) => (wait = setTimeout(resolve, TERM_GRACE_MS + 1000)))]);
    clearTimeout(wait);
    if (isSandboxError(error, 'EXEC_FAILED') && /Resource temporarily unavailable/.test(error.message)) {
      throw outOfProcesses(sandbox, operation, path, error);
    }
    throw error;
  } finally {
    clearTimeout(timer);
    if (onAbort) signal?.removeEventListener('abort', onAbort);
  }
}

/** Keeps the last bytes of a helper's stderr. */
export class StderrTail {
  private text = '';

  push(chunk: Buffer): void {
    this.text = (this.text + chunk.toString('utf8')).slice(-STDERR_KEEP_BYTES);
  }

  failure(exit: AgentExit): HelperFailure {
    return { exitCode: exit.exitCode, signal: exit.signal, stderr: this.text };
  }

  toString(): string {
    return this.text;
  }
}

export interface HelperResult extends HelperFailure {
  stdout: Buffer;
  ok: boolean;
}

export interface RunHelperOptions extends GuardOptions {
  /** Stdout beyond this is an error (LIMIT_EXCEEDED): the output is parsed in memory. */
  maxStdoutBytes: number;
}

/** Runs one helper to completion, keeping its stdout (bounded) and the tail of its stderr. */
export async function runHelper(sandbox: BackendSandbox, argv: string[], options: RunHelperOptions): Promise<HelperResult> {
  const proc = await startHelper(sandbox, helperRequest(argv), options);
  const guard = new HelperGuard(proc, options);
  const chunks: Buffer[] = [];
  let stdoutBytes = 0;
  let overflowed = false;
  const stderr = new StderrTail();
  proc.onStdout((chunk) => {
    stdoutBytes += chunk.length;
    if (stdoutBytes > options.maxStdoutBytes) {
      if (!overflowed) proc.signal('SIGKILL');
      overflowed = true;
      return;
    }
    chunks.push(chunk);
  });
  proc.onStderr((chunk) => stderr.push(chunk));
  const exit = await proc.exited;
  guard.dispose();
  const guardError = guard.error();
  if (guardError) throw guardError;
  if (exit.lost) throw lostError(sandbox.id, options.operation, options.path);
  if (overflowed) {
    throw new SandboxError('LIMIT_EXCEEDED', `${options.operation} of ${options.path} returned more than ${options.maxStdoutBytes} bytes of entries`, {
      details: { path: options.path, operation: options.operation, limitBytes: options.maxStdoutBytes },
      hint: 'List a smaller directory or a smaller depth.',
    });
  }
  return { stdout: Buffer.concat(chunks), ok: exit.exitCode === 0, ...stderr.failure(exit) };
}
