import type { AgentProcess } from '../../backends/agent/index.js';
import type { BackendSandbox } from '../../backends/backend.js';
import { SandboxError } from '../../errors/index.js';
import type { WatchEvent } from '../../wire/index.js';
import { fileError, type FileErrorContext } from './errors.js';
import { HelperGuard, StderrTail, helperRequest, lostError, startHelper } from './helper.js';
import { UPLOAD_TEMP_PREFIX, WATCH_EVENTS } from './scripts.js';

/** Queued events past which inotifywait is paused (the kernel queues meanwhile). */
const PAUSE_AT_EVENTS = 1000;
const RESUME_AT_EVENTS = 100;
/** Queued events past which the watch fails: only a watcher resumed from inside the sandbox gets here. */
const FAIL_AT_EVENTS = 100_000;

export interface WatchOptions {
  recursive: boolean;
  signal?: AbortSignal | undefined;
  /** How long inotifywait may take to establish its watches. */
  setupTimeoutMs: number;
  context: Omit<FileErrorContext, 'operation'>;
}

/**
 * inotify event names to WatchEvent types, as fsnotify (E2B's watcher) maps them: a file moved in
 * is a create, a file moved out is a rename.
 */
const EVENT_TYPES: Record<string, WatchEvent['type']> = {
  CREATE: 'create',
  MOVED_TO: 'create',
  MODIFY: 'write',
  DELETE: 'remove',
  DELETE_SELF: 'remove',
  MOVED_FROM: 'rename',
  MOVE_SELF: 'rename',
  ATTRIB: 'chmod',
};

/** Parses inotifywait `%e\0%w%f\0` records; returns the events and the unparsed rest. */
export function parseWatchOutput(buffer: Buffer): { events: WatchEvent[]; rest: Buffer } {
  const events: WatchEvent[] = [];
  let offset = 0;
  for (;;) {
    const first = buffer.indexOf(0, offset);
    if (first === -1) break;
    const second = buffer.indexOf(0, first + 1);
    if (second === -1) break;
    const names = buffer.subarray(offset, first).toString('utf8').split(',');
    let path = buffer.subarray(first + 1, second).toString('utf8');
    offset = second + 1;
    if (path.length > 1 && path.endsWith('/')) path = path.slice(0, -1);
    const type = names.map((name) => EVENT_TYPES[name]).find((found) => found !== undefined);
    const base = path.slice(path.lastIndexOf('/') + 1);
    if (type === undefined || base.startsWith(UPLOAD_TEMP_PREFIX)) continue; // our own atomic-write temp files
    events.push({ type, path });
  }
  return { events, rest: buffer.subarray(offset) };
}

/**
 * A running `inotifywait -m` in the sandbox. It starts on first iteration (or when `ready` is
 * read) and stops when iteration ends, `close()` is called or the signal aborts. Events queue
 * while the consumer is busy; past PAUSE_AT_EVENTS the watcher is paused with SIGSTOP.
 */
export class SandboxWatch implements AsyncIterable<WatchEvent> {
  private starting: Promise<void> | undefined;
  private proc: AgentProcess | undefined;
  private readonly queue: WatchEvent[] = [];
  private pending: Buffer = Buffer.alloc(0);
  private failure: SandboxError | undefined;
  private isDone = false;
  private isClosing = false;
  private isPaused = false;
  private wake: (() => void) | undefined;
  private readonly readyPromise: Promise<void>;
  private markReady!: () => void;
  private failReady!: (error: SandboxError) => void;

  constructor(
    private readonly sandbox: BackendSandbox,
    private readonly path: string,
    private readonly options: WatchOptions,
  ) {
    this.readyPromise = new Promise<void>((resolve, reject) => {
      this.markReady = resolve;
      this.failReady = reject;
    });
    this.readyPromise.catch(() => undefined);
  }

  /** Resolves once the watches are established: changes after this are reported. */
  get ready(): Promise<void> {
    this.start();
    return this.readyPromise;
  }

  async *[Symbol.asyncIterator](): AsyncIterator<WatchEvent> {
    this.start();
    try {
      for (;;) {
        const event = this.queue.shift();
        if (event !== undefined) {
          if (this.isPaused && this.queue.length <= RESUME_AT_EVENTS) {
            this.isPaused = false;
            this.proc?.signal('SIGCONT');
          }
          yield event;
          continue;
        }
        if (this.isDone) {
          if (this.failure) throw this.failure;
          return;
        }
        await new Promise<void>((resolve) => (this.wake = resolve));
      }
    } finally {
      await this.close();
    }
  }

  /** Stops the watcher and waits for it to exit. Safe to call twice. */
  async close(): Promise<void> {
    this.isClosing = true;
    await this.starting;
    const proc = this.proc;
    if (proc === undefined) return;
    proc.signal('SIGKILL');
    await proc.exited;
  }

  private start(): void {
    this.starting ??= this.launch().catch((error: SandboxError) => this.finish(error));
  }

  private async launch(): Promise<void> {
    const { signal, recursive, setupTimeoutMs } = this.options;
    if (signal?.aborted) {
      this.finish(undefined);
      return;
    }
    const argv = ['inotifywait', '-m', ...(recursive ? ['-r'] : []), '-e', WATCH_EVENTS, '--no-newline', '--format', '%e%0%w%f%0', '--', this.path];
    const guardOptions = { operation: 'watch' as const, path: this.path, timeoutMs: setupTimeoutMs };
    const proc = await startHelper(this.sandbox, helperRequest(argv), guardOptions);
    this.proc = proc;
    if (this.isClosing) proc.signal('SIGKILL');
    const guard = new HelperGuard(proc, guardOptions);
    const stderr = new StderrTail();
    const onAbort = (): void => {
      this.isClosing = true;
      proc.signal('SIGKILL');
    };
    signal?.addEventListener('abort', onAbort, { once: true });
    if (signal?.aborted) onAbort();
    proc.onStderr((chunk) => {
      stderr.push(chunk);
      if (stderr.toString().includes('Watches established')) {
        guard.dispose();
        this.markReady();
      }
    });
    proc.onStdout((chunk) => {
      const { events, rest } = parseWatchOutput(Buffer.concat([this.pending, chunk]));
      this.pending = rest;
      if (this.isDone) return;
      for (const event of events) this.queue.push(event);
      if (this.queue.length >= FAIL_AT_EVENTS) {
        this.isClosing = true;
        proc.signal('SIGKILL');
        this.finish(
          new SandboxError('LIMIT_EXCEEDED', `watch of ${this.path} stopped: more than ${FAIL_AT_EVENTS} events are waiting to be read`, {
            details: { path: this.path, limitEvents: FAIL_AT_EVENTS },
            hint: 'Read watch events steadily, or watch a smaller directory.',
          }),
        );
        return;
      }
      if (this.queue.length >= PAUSE_AT_EVENTS) {
        this.isPaused = true; // again on every batch over the mark: something may have resumed it
        proc.signal('SIGSTOP');
      }
      this.wake?.();
    });
    void proc.exited.then((exit) => {
      guard.dispose();
      signal?.removeEventListener('abort', onAbort);
      const context = { ...this.options.context, operation: 'watch' as const };
      let error = guard.error();
      if (error === undefined && !this.isClosing) {
        if (exit.lost) error = lostError(this.sandbox.id, 'watch', this.path);
        else if (exit.exitCode !== 0) error = fileError(stderr.failure(exit), context);
      }
      this.finish(error);
    });
  }

  private finish(error: SandboxError | undefined): void {
    this.isDone = true;
    this.failure = error;
    if (error) this.failReady(error);
    else this.markReady();
    this.wake?.();
  }
}
