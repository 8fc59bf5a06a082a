import { Readable } from 'node:stream';
import { SandboxError } from '../../errors/index.js';
import type { BackendSandbox } from '../../backends/backend.js';
import { fileError, type FileErrorContext } from './errors.js';
import { HelperGuard, StderrTail, helperRequest, lostError, startHelper } from './helper.js';

/** Bytes the returned stream buffers before the helper is paused. */
export const READ_HIGH_WATER_BYTES = 1024 * 1024;
/**
 * Bytes buffered past which the read fails. A paused helper stops well below it; only a process in
 * the sandbox that keeps resuming the helper (SIGCONT, same uid) can push past it, and it must not
 * be able to grow the server's memory without bound.
 */
export const READ_HARD_LIMIT_BYTES = 16 * 1024 * 1024;

export interface ReadOptions {
  signal?: AbortSignal | undefined;
  /** The read fails when neither the sandbox sends data nor the consumer takes any for this long. */
  idleTimeoutMs: number;
  context: Omit<FileErrorContext, 'operation'>;
}

/**
 * Streams a file out of the sandbox with `cat`. The agent forwards output as fast as it comes and
 * cannot be paused, so back-pressure pauses the producer instead: when the stream's buffer is full
 * the helper gets SIGSTOP, and SIGCONT when the consumer reads again. What is in flight when it
 * stops (a pipe and a frame or two) is the only overshoot, so memory stays bounded however slow
 * the consumer. Resolves once the first bytes (or a clean end) arrive, so a missing file rejects
 * here rather than failing the stream later.
 */
export async function openRead(sandbox: BackendSandbox, path: string, options: ReadOptions): Promise<Readable> {
  const guardOptions = { operation: 'read' as const, path, timeoutMs: options.idleTimeoutMs, signal: options.signal };
  const proc = await startHelper(sandbox, helperRequest(['cat', '--', path]), guardOptions);
  const guard = new HelperGuard(proc, guardOptions);
  const stderr = new StderrTail();
  let isStopped = false;
  let hasEnded = false;
  const stream = new Readable({
    highWaterMark: READ_HIGH_WATER_BYTES,
    read() {
      guard.touch();
      if (isStopped) {
        isStopped = false;
        proc.signal('SIGCONT');
      }
    },
    destroy(error, callback) {
      if (!hasEnded) guard.kill('aborted');
      callback(error);
    },
  });
  return new Promise<Readable>((resolve, reject) => {
    let isSettled = false;
    proc.onStdout((chunk) => {
      guard.touch();
      if (!isSettled) {
        isSettled = true;
        resolve(stream);
      }
      if (stream.destroyed) return;
      if (stream.readableLength + chunk.length > READ_HARD_LIMIT_BYTES) {
        guard.kill('aborted');
        stream.destroy(resumedError(path));
        return;
      }
      // Stop again on every chunk that arrives over the mark: something may have resumed it.
      if (!stream.push(chunk)) {
        isStopped = true;
        proc.signal('SIGSTOP');
      }
    });
    proc.onStderr((chunk) => stderr.push(chunk));
    void proc.exited.then((exit) => {
      hasEnded = true;
      guard.dispose();
      const error =
        guard.error() ??
        (exit.lost
          ? lostError(sandbox.id, 'read', path)
          : exit.exitCode !== 0
            ? fileError(stderr.failure(exit), { ...options.context, operation: 'read' })
            : undefined);
      if (!isSettled) {
        isSettled = true;
        if (error) {
          reject(error);
          return;
        }
        resolve(stream);
      }
      if (error) stream.destroy(error);
      else stream.push(null);
    });
  });
}

function resumedError(path: string): SandboxError {
  return new SandboxError('LIMIT_EXCEEDED', `read of ${path} stopped: the sandbox kept sending while the reader was paused`, {
    details: { path, limitBytes: READ_HARD_LIMIT_BYTES },
    hint: 'Read the stream steadily; a process in the sandbox may be resuming the paused reader.',
  });
}
