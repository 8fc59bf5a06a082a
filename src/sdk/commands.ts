import { AbortedError, ConnectionError, errorFromStreamEvent } from './errors.js';
import { callOptions, type HttpClient, type OpenResponse } from './http.js';
import { readNdjson } from './ndjson.js';
import type { CallOptions, ExecResult, ProcessInfo, Warning, WireProcessEvent } from './types.js';

/** Where a process's output goes while it runs. Output is decoded as UTF-8, split sequences kept whole. */
export interface OutputCallbacks {
  onStdout?: (data: string) => void;
  onStderr?: (data: string) => void;
  /** A warning before a limit ends the process (memory pressure). */
  onWarning?: (warning: Warning) => void;
}

export interface RunOptions extends OutputCallbacks {
  /** Called with the process id once the process started. */
  onStart?: (pid: number) => void;
  /** Working directory inside the sandbox. @default spec.cwd ('/workspace') */
  cwd?: string;
  /** Added on top of the spec's environment. */
  env?: Record<string, string>;
  /**
   * Wall-clock limit of the process, enforced by the server: past it the result has
   * `outcome: 'limit_exceeded'` and `limit.resource: 'wall_clock'`. @default spec.limits.wallClockMs
   */
  timeoutMs?: number;
  /** Bytes written to stdin, which is then closed; `true` keeps stdin open for `sendStdin`. @default closed */
  stdin?: string | Uint8Array | boolean;
  /** Return a `CommandHandle` as soon as the process started instead of waiting for its end. @default false */
  background?: boolean;
  /** Free-form label, shown by `commands.list()`. */
  tag?: string;
  /**
   * Aborting a foreground run kills the process (SIGKILL) and rejects with `AbortedError`; for a
   * background one it only stops the output callbacks.
   */
  signal?: AbortSignal;
  /** Deadline for the server to accept the process (not for the process itself). @default 60000 */
  requestTimeoutMs?: number;
}

export interface ConnectOptions extends OutputCallbacks {
  /** Ends the event stream (not the process). */
  signal?: AbortSignal;
  /** Deadline for the server to accept the event stream. @default 60000 */
  requestTimeoutMs?: number;
}

/**
 * Processes of one sandbox. A string command runs as `sh -c <command>` inside the sandbox; pass
 * an argv array to run a program directly.
 */
export class Commands {
  constructor(
    private readonly http: HttpClient,
    private readonly base: string,
  ) {}

  run(command: string | string[], options: RunOptions & { background: true }): Promise<CommandHandle>;
  run(command: string | string[], options?: RunOptions & { background?: false }): Promise<ExecResult>;
  run(command: string | string[], options: RunOptions): Promise<ExecResult | CommandHandle>;
  async run(command: string | string[], options: RunOptions = {}): Promise<ExecResult | CommandHandle> {
    const argv = typeof command === 'string' ? ['sh', '-c', command] : command;
    const stdinData = typeof options.stdin === 'boolean' ? undefined : options.stdin;
    const request = {
      method: 'POST' as const,
      path: `${this.base}/processes`,
      json: {
        argv,
        cwd: options.cwd,
        env: options.env,
        timeoutMs: options.timeoutMs,
        stdin: options.stdin !== undefined && options.stdin !== false,
        background: options.background === true,
        tag: options.tag,
      },
      timeoutMs: options.requestTimeoutMs,
      signal: options.signal,
    };
    if (options.background === true) {
      const { pid } = await this.http.json<{ pid: number }>(request);
      const handle = new CommandHandle(this.http, this.base, pid, options);
      options.onStart?.(pid);
      if (options.onStdout || options.onStderr || options.onWarning) handle.startStreaming(options.signal);
      if (stdinData !== undefined) {
        const call = { signal: options.signal, timeoutMs: options.requestTimeoutMs };
        await handle.sendStdin(stdinData, call);
        await handle.closeStdin(call);
      }
      return handle;
    }
    return this.runForeground(await this.http.open(request), stdinData, options);
  }

  /** Attaches to a running (or finished, still known) process; its output is replayed from the start. */
  async connect(pid: number, options: ConnectOptions = {}): Promise<CommandHandle> {
    const handle = new CommandHandle(this.http, this.base, pid, options);
    await handle.startStreaming(options.signal, options.requestTimeoutMs).opened;
    return handle;
  }

  /** Sends a signal to a process by pid. @default 'SIGKILL' */
  async kill(pid: number, signal: NodeJS.Signals = 'SIGKILL', options: CallOptions = {}): Promise<void> {
    await new CommandHandle(this.http, this.base, pid).kill(signal, options);
  }

  /** Running processes and recently ended ones. */
  async list(options: CallOptions = {}): Promise<ProcessInfo[]> {
    const reply = await this.http.json<{ processes: ProcessInfo[] }>({ method: 'GET', path: `${this.base}/processes`, ...callOptions(options) });
    return reply.processes;
  }

  private async runForeground(open: OpenResponse, stdinData: string | Uint8Array | undefined, options: RunOptions): Promise<ExecResult> {
    let pid: number | undefined;
    const onStart = (started: number) => {
      pid = started;
      options.onStart?.(started);
      // Once the process has ended, a failed stdin write no longer matters: its result says all.
      if (stdinData !== undefined) writeAndClose(this.http, this.base, started, stdinData, options.signal).catch(() => undefined);
    };
    try {
      return await follow({ http: this.http, base: this.base, open, output: new OutputDecoder(options), signal: options.signal, onStart });
    } catch (error) {
      if (error instanceof AbortedError && pid !== undefined) await killAndWait(this.http, this.base, pid);
      throw error;
    }
  }
}

/**
 * A process started with `background: true` or found with `commands.connect(pid)`. Output
 * callbacks fire once its event stream is open (at start when callbacks were given, else on
 * `wait()`); `disconnect()` stops listening and leaves the process running.
 */
export class CommandHandle {
  private streaming: { opened: Promise<void>; result: Promise<ExecResult> } | undefined;
  private readonly stop = new AbortController();

  constructor(
    private readonly http: HttpClient,
    private readonly base: string,
    readonly pid: number,
    private readonly callbacks: OutputCallbacks = {},
  ) {}

  /** Resolves with the result when the process ends. */
  async wait(options: { signal?: AbortSignal } = {}): Promise<ExecResult> {
    const { result } = this.startStreaming();
    if (!options.signal) return result;
    return raceAbort(result, options.signal, `waiting for process ${this.pid}`);
  }

  /** Sends a signal to the process. @default 'SIGKILL' */
  async kill(signal: NodeJS.Signals = 'SIGKILL', options: CallOptions = {}): Promise<void> {
    await this.http.json({ method: 'POST', path: `${this.path}/signal`, json: { signal }, ...callOptions(options) });
  }

  /** Writes to stdin (the process must have been started with `stdin: true`). */
  async sendStdin(data: string | Uint8Array, options: CallOptions = {}): Promise<void> {
    await this.http.json({ method: 'POST', path: `${this.path}/stdin`, body: data, ...callOptions(options) });
  }

  async closeStdin(options: CallOptions = {}): Promise<void> {
    await this.http.json({ method: 'POST', path: `${this.path}/stdin/close`, ...callOptions(options) });
  }

  /** Stops listening to the process's events; the process keeps running. A pending `wait()` rejects. */
  disconnect(): void {
    this.stop.abort();
  }

  /** @internal Opens the event stream once; later calls share it. */
  startStreaming(signal?: AbortSignal, timeoutMs?: number): { opened: Promise<void>; result: Promise<ExecResult> } {
    if (this.streaming) return this.streaming;
    const streamSignal = signal ? AbortSignal.any([signal, this.stop.signal]) : this.stop.signal;
    const opened = this.http.open({ method: 'GET', path: `${this.path}/events`, signal: streamSignal, timeoutMs });
    const result = opened.then((open) => this.consume(open, streamSignal));
    // Both are observed by whoever awaits them; these keep an unobserved failure from crashing Node.
    opened.catch(() => undefined);
    result.catch(() => undefined);
    this.streaming = { opened: opened.then(() => undefined), result };
    return this.streaming;
  }

  private get path(): string {
    return `${this.base}/processes/${this.pid}`;
  }

  private consume(open: OpenResponse, signal: AbortSignal): Promise<ExecResult> {
    return follow({ http: this.http, base: this.base, open, output: new OutputDecoder(this.callbacks), signal, pid: this.pid });
  }
}

/** Times a broken event stream is reattached before the error is thrown. */
const MAX_REATTACH = 3;

interface FollowOptions {
  http: HttpClient;
  base: string;
  open: OpenResponse;
  output: OutputDecoder;
  signal?: AbortSignal;
  /** Known when following an existing process; else taken from the `start` event. */
  pid?: number;
  onStart?: (pid: number) => void;
}

/**
 * Reads a process's events up to its exit. When the stream breaks (a proxy's idle timeout, a
 * dropped connection), it reattaches — the server replays from the start — and skips what was
 * already delivered, so callbacks see each byte once.
 */
async function follow(options: FollowOptions): Promise<ExecResult> {
  let { open, pid } = options;
  for (let reattached = 0; ; reattached++) {
    let result: ExecResult | undefined;
    try {
      for await (const event of readNdjson<WireProcessEvent>(open.chunks())) {
        if (event.type === 'start' && pid === undefined) {
          pid = event.pid;
          options.onStart?.(pid);
        }
        result = options.output.handle(event);
        if (result) return result;
      }
      throw streamEnded(pid);
    } catch (error) {
      if (!(error instanceof ConnectionError) || pid === undefined || reattached >= MAX_REATTACH) throw error;
    } finally {
      // After the exit event the server ends the stream: its connection is kept for the next call.
      if (result) open.finish();
      else open.close();
    }
    options.output.replayFromStart();
    open = await options.http.open({ method: 'GET', path: `${options.base}/processes/${pid}/events`, signal: options.signal });
  }
}

type Counts = { stdout: number; stderr: number; warnings: number };

/**
 * Turns wire events into callbacks; returns the result on `exit`. After `replayFromStart()` it
 * skips the bytes and warnings it had already delivered. A result carries at most 1 MiB of each
 * stream inline (`stdoutInlineTruncated`); the decoder keeps the bytes the events delivered and
 * puts the whole kept output back into such a result.
 */
class OutputDecoder {
  private readonly stdout = new TextDecoder();
  private readonly stderr = new TextDecoder();
  private readonly delivered: Counts = { stdout: 0, stderr: 0, warnings: 0 };
  private replayed: Counts | undefined;
  private readonly received: Record<'stdout' | 'stderr', Buffer[]> = { stdout: [], stderr: [] };

  constructor(private readonly callbacks: OutputCallbacks) {}

  replayFromStart(): void {
    this.replayed = { stdout: 0, stderr: 0, warnings: 0 };
  }

  handle(event: WireProcessEvent): ExecResult | undefined {
    switch (event.type) {
      case 'stdout': {
        const fresh = this.fresh('stdout', Buffer.from(event.data, 'base64'));
        if (fresh.length > 0) {
          this.received.stdout.push(fresh);
          this.callbacks.onStdout?.(this.stdout.decode(fresh, { stream: true }));
        }
        return undefined;
      }
      case 'stderr': {
        const fresh = this.fresh('stderr', Buffer.from(event.data, 'base64'));
        if (fresh.length > 0) {
          this.received.stderr.push(fresh);
          this.callbacks.onStderr?.(this.stderr.decode(fresh, { stream: true }));
        }
        return undefined;
      }
      case 'warning':
        if (this.fresh('warnings', 1) > 0) this.callbacks.onWarning?.(event.warning);
        return undefined;
      case 'exit':
        return this.whole(event.result);
      case 'error':
        throw errorFromStreamEvent(event.error);
      default:
        return undefined;
    }
  }

  /** `result` with the kept output the events delivered where it carries only the start of it. */
  private whole(result: ExecResult): ExecResult {
    const { stdoutInlineTruncated, stderrInlineTruncated, ...rest } = result;
    if (!stdoutInlineTruncated && !stderrInlineTruncated) return result;
    return {
      ...rest,
      stdout: stdoutInlineTruncated ? Buffer.concat(this.received.stdout).toString('utf8') : result.stdout,
      stderr: stderrInlineTruncated ? Buffer.concat(this.received.stderr).toString('utf8') : result.stderr,
    };
  }

  /** The part of `data` (bytes, or a count of warnings) not delivered before. */
  private fresh<T extends Buffer | number>(kind: keyof Counts, data: T): T {
    const size = typeof data === 'number' ? data : data.length;
    if (this.replayed === undefined) {
      this.delivered[kind] += size;
      return data;
    }
    const toSkip = Math.max(0, this.delivered[kind] - this.replayed[kind]);
    this.replayed[kind] += size;
    const kept = Math.max(0, size - toSkip);
    this.delivered[kind] += kept;
    return (typeof data === 'number' ? kept : data.subarray(size - kept)) as T;
  }
}

function streamEnded(pid: number | undefined): ConnectionError {
  const which = pid === undefined ? 'the process' : `process ${pid}`;
  return new ConnectionError('SERVER_UNREACHABLE', `the event stream of ${which} ended before its exit event`, {
    hint:
      pid === undefined
        ? 'The connection broke or the server restarted; list the processes with commands.list().'
        : `The connection broke or the server restarted; reattach with commands.connect(${pid}).`,
    details: { pid },
  });
}

async function writeAndClose(http: HttpClient, base: string, pid: number, data: string | Uint8Array, signal?: AbortSignal): Promise<void> {
  const path = `${base}/processes/${pid}/stdin`;
  await http.json({ method: 'POST', path, body: data, signal });
  await http.json({ method: 'POST', path: `${path}/close`, signal });
}

/** How long an aborted run waits for its killed process to end before it rejects anyway. */
const KILL_WAIT_MS = 5_000;

/**
 * Kills the process of an aborted run and waits for its exit event, so that once the run rejects
 * the process is gone (a `commands.list()` right after sees it ended). Best effort: the caller
 * already has the error that matters.
 */
async function killAndWait(http: HttpClient, base: string, pid: number): Promise<void> {
  const path = `${base}/processes/${pid}`;
  try {
    await http.json({ method: 'POST', path: `${path}/signal`, json: { signal: 'SIGKILL' }, timeoutMs: KILL_WAIT_MS });
    const open = await http.open({ method: 'GET', path: `${path}/events`, timeoutMs: KILL_WAIT_MS, signal: AbortSignal.timeout(KILL_WAIT_MS) });
    let exited = false;
    try {
      for await (const event of readNdjson<WireProcessEvent>(open.chunks())) if ((exited = event.type === 'exit')) break;
    } finally {
      if (exited) open.finish();
      else open.close();
    }
  } catch {
    // Unreachable server, unknown process, slow exit: nothing more to do for a run already aborted.
  }
}


function raceAbort<T>(promise: Promise<T>, signal: AbortSignal, what: string): Promise<T> {
  const aborted = () => new AbortedError('ABORTED', `${what} was aborted by the caller's AbortSignal`);
  if (signal.aborted) return Promise.reject(aborted());
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(aborted());
    signal.addEventListener('abort', onAbort, { once: true });
    void promise.then(resolve, reject).finally(() => signal.removeEventListener('abort', onAbort));
  });
}
