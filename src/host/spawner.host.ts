/**
 * Starts long-lived children through capsule-spawn (native/capsule-spawn.c), one small static
 * helper per server, instead of forking the server. A fork copies the page tables of the process
 * that forks and leaves it a fault on each page it writes next, and Node's spawn blocks its event
 * loop until the child has exec'd: with hundreds of MiB mapped, ~4.5 ms of the loop per sandbox,
 * a quarter of the server's time when creating at 1,000 live.
 *
 * The helper is started on first use, dies with this process, and is started again if it is
 * gone. It holds this process alive only while something waits on it.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { SandboxError } from '../errors/index.js';

/** A child the helper started. */
export interface SpawnedChild {
  readonly pid: number;
  /** Resolves once its stdout began with `ready\n`; rejects when it ended without, or the helper went away. */
  readonly ready: Promise<void>;
  /**
   * Resolves once it has ended, with its status (exit code, 128+N for signal N), or undefined
   * when the helper went away first (then the caller watches the pid itself). Waiting keeps this
   * process alive.
   */
  exited(): Promise<number | undefined>;
  kill(signal?: NodeJS.Signals): void;
}

interface Waiting {
  started: { resolve: (pid: number) => void; reject: (error: Error) => void };
  ready: { resolve: () => void; reject: (error: Error) => void };
}

interface Running {
  status: number | undefined;
  ended: boolean;
  waiters: ((status: number | undefined) => void)[];
  /** Whether spawn() has handed it out; until then an exit is kept here for it. */
  claimed: boolean;
}

export class Spawner {
  private helper: ChildProcess | undefined;
  private nextId = 0;
  private readonly waiting = new Map<string, Waiting>();
  private readonly running = new Map<number, Running>();
  /** Promises someone awaits (a start, a ready, an exit): while any, the helper's pipe is ref'd. */
  private holds = 0;

  constructor(private readonly helperPath: string) {}

  /**
   * Starts `program` with `args`, an empty environment, a session of its own, /dev/null on
   * stdin, a pipe on stdout (read by the helper, for `ready`) and `logPath` (created 0600,
   * truncated) on stderr. Resolves once it is started.
   */
  async spawn(program: string, args: readonly string[], logPath: string): Promise<SpawnedChild> {
    const id = String(this.nextId++);
    const fields = [id, logPath, program, ...args];
    for (const field of fields) {
      if (field.includes('\0')) throw new SandboxError('INTERNAL', `a spawn argument holds a NUL byte: ${JSON.stringify(field)}`);
    }
    const payload = Buffer.from(fields.map((field) => `${field}\0`).join(''), 'utf8');
    const frame = Buffer.alloc(4 + payload.length);
    frame.writeUInt32LE(payload.length, 0);
    payload.copy(frame, 4);
    const helper = this.start();
    let readyResolve!: () => void;
    let readyReject!: (error: Error) => void;
    const ready = new Promise<void>((resolve, reject) => {
      readyResolve = resolve;
      readyReject = reject;
    });
    ready.catch(() => undefined);
    const pid = await this.held(
      new Promise<number>((resolve, reject) => {
        this.waiting.set(id, { started: { resolve, reject }, ready: { resolve: readyResolve, reject: readyReject } });
        helper.stdin!.write(frame);
      }),
    );
    // Held until it settles; a caller that awaits the start but not (yet) ready is no unhandled rejection.
    const readyHeld = this.held(ready);
    readyHeld.catch(() => undefined);
    const running = this.entry(pid);
    running.claimed = true;
    if (running.ended) this.running.delete(pid);
    return {
      pid,
      ready: readyHeld,
      exited: () => (running.ended ? Promise.resolve(running.status) : this.held(new Promise((resolve) => running.waiters.push(resolve)))),
      kill: (signal = 'SIGKILL') => {
        if (running.ended) return;
        try {
          process.kill(pid, signal);
        } catch {
          // gone meanwhile
        }
      },
    };
  }

  /** Ends the helper (what it started keeps running). */
  close(): void {
    this.helper?.stdin?.end();
    this.helper = undefined;
  }

  private async held<T>(promise: Promise<T>): Promise<T> {
    this.hold(1);
    try {
      return await promise;
    } finally {
      this.hold(-1);
    }
  }

  private hold(delta: number): void {
    this.holds += delta;
    const out = this.helper?.stdout;
    if (!out) return;
    const handle = out as unknown as { ref(): void; unref(): void };
    if (this.holds > 0) handle.ref();
    else handle.unref();
  }

  private start(): ChildProcess {
    if (this.helper && this.helper.exitCode === null && this.helper.signalCode === null) return this.helper;
    const helper = spawn(this.helperPath, [], { stdio: ['pipe', 'pipe', 'inherit'], env: {} });
    this.helper = helper;
    helper.unref();
    (helper.stdin as unknown as { unref(): void }).unref();
    if (this.holds === 0) (helper.stdout as unknown as { unref(): void }).unref();
    let pendingText = '';
    helper.stdout.setEncoding('utf8');
    helper.stdout.on('data', (chunk: string) => {
      pendingText += chunk;
      let newline: number;
      while ((newline = pendingText.indexOf('\n')) !== -1) {
        this.heard(pendingText.slice(0, newline));
        pendingText = pendingText.slice(newline + 1);
      }
    });
    const gone = (why: string): void => {
      if (this.helper === helper) this.helper = undefined;
      const error = new SandboxError('HOST_NOT_READY', `the process starter (capsule-spawn) ${why}`, {
        hint: 'Check that dist/native/capsule-spawn is built (npm run build) and the server log for its message.',
      });
      for (const waiting of this.waiting.values()) {
        waiting.started.reject(error);
        waiting.ready.reject(error);
      }
      this.waiting.clear();
      // Its children are init's now: their ends are for their callers to watch.
      for (const running of this.running.values()) settle(running, undefined);
      this.running.clear();
    };
    helper.once('error', (error) => gone(`could not start: ${error.message}`));
    helper.once('close', (code, signal) => gone(`exited ${signal ?? code}`));
    return helper;
  }

  private entry(pid: number): Running {
    let running = this.running.get(pid);
    if (!running) this.running.set(pid, (running = { status: undefined, ended: false, waiters: [], claimed: false }));
    return running;
  }

  private heard(line: string): void {
    const [kind, first, second] = line.split(' ');
    if (kind === 'X') {
      const pid = Number(first);
      // An exit may be read before spawn() has taken its start's answer: it is kept for it.
      const running = this.entry(pid);
      settle(running, Number(second));
      if (running.claimed) this.running.delete(pid);
      return;
    }
    const waiting = first === undefined ? undefined : this.waiting.get(first);
    if (!waiting) return;
    if (kind === 'S') {
      waiting.started.resolve(Number(second));
    } else if (kind === 'F') {
      this.waiting.delete(first!);
      const error = new SandboxError('HOST_NOT_READY', `cannot start a process: errno ${second}`, { hint: 'The host may be out of processes or memory.' });
      waiting.started.reject(error);
      waiting.ready.reject(error);
    } else if (kind === 'R' || kind === 'N') {
      this.waiting.delete(first!);
      if (kind === 'R') waiting.ready.resolve();
      else waiting.ready.reject(new SandboxError('SANDBOX_CRASHED', 'the process exited before it said it was ready'));
    }
  }
}

function settle(running: Running, status: number | undefined): void {
  if (running.ended) return;
  running.ended = true;
  running.status = status;
  for (const waiter of running.waiters.splice(0)) waiter(status);
}

const spawners = new Map<string, Spawner>();

/** The one Spawner of this process for the helper at `helperPath`. */
export function spawnerAt(helperPath: string): Spawner {
  let spawner = spawners.get(helperPath);
  if (!spawner) spawners.set(helperPath, (spawner = new Spawner(helperPath)));
  return spawner;
}
