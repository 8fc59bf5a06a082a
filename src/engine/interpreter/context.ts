import { SandboxError } from '../../errors/index.js';
import type { BackendSandbox } from '../../backends/backend.js';
import type { AgentExit } from '../../backends/agent/index.js';
import { randomBytes } from 'node:crypto';
import { DriverProcess, driverLabel } from './driver.js';
import { ExecutionBuilder, type DriverEvent } from './protocol.js';
import { memoryLimit, timeoutLimit } from './limits.js';
import type { TypeStripper } from './typescript.js';
import type { RunCodeOptions } from './types.js';
import type { ContextInfo, Execution } from '../../wire/index.js';

/** How long interrupted code has to stop before the driver is killed and the context restarted. */
export const INTERRUPT_GRACE_MS = 2000;
/** How long a JavaScript driver has to answer an interrupt request before SIGINT breaks its sync code. */
const BREAK_SYNC_DELAY_MS = 200;
const STOP_GRACE_MS = 2000;
/** How long an unexplained driver exit waits to learn whether the whole sandbox went away. */
const SANDBOX_LOST_WAIT_MS = 250;
export const DEFAULT_START_TIMEOUT_MS = 60_000;

interface StartOptions {
  timeoutMs?: number;
  signal?: AbortSignal;
}

type Settled = { how: 'end' } | { how: 'died' } | { how: 'exited'; exit: AgentExit };

interface Running {
  id: string;
  driver: DriverProcess;
  builder: ExecutionBuilder;
  settle: (settled: Settled) => void;
}

export interface ContextOptions {
  sandbox: BackendSandbox;
  info: ContextInfo;
  /** The driver's complete environment. */
  env: Record<string, string>;
  stripper: TypeStripper;
  /** Its language's default context (kept in the driver's label for a server that reattaches). */
  isDefault?: boolean;
  /** The envVars it was created with (ditto). */
  envVars?: Record<string, string>;
}

/**
 * One interpreter context: a driver process in the sandbox holding a live interpreter, so state
 * persists between runs. Runs are serialized; restart and close act at once.
 */
export class InterpreterContext {
  readonly info: ContextInfo;
  private readonly sandbox: BackendSandbox;
  private readonly env: Record<string, string>;
  private readonly stripper: TypeStripper;
  private driver: DriverProcess | undefined;
  private starting: Promise<void> | undefined;
  /** Why the interpreter is gone (set until a restart). */
  private deadReason: string | undefined;
  private isClosed = false;
  private generation = 0;
  private sequence = 0;
  /**
   * Prefix of this object's execution ids: a driver adopted after a restart may still finish an
   * execution the previous server started, whose events must not be taken for a new one's.
   */
  private readonly epoch = randomBytes(4).toString('hex');
  private readonly isDefault: boolean;
  private readonly envVars: Record<string, string> | undefined;
  private current: Running | undefined;
  private queue: Promise<unknown> = Promise.resolve();

  constructor(options: ContextOptions) {
    this.info = options.info;
    this.sandbox = options.sandbox;
    this.env = options.env;
    this.stripper = options.stripper;
    this.isDefault = options.isDefault === true;
    this.envVars = options.envVars;
  }

  /** Takes over the driver an earlier server started for this context (after a reattach). */
  adopt(driver: DriverProcess): void {
    this.attach(driver);
    this.driver = driver;
    this.deadReason = undefined;
  }

  /** Starts the interpreter; resolves when it is ready for code. */
  start(options: StartOptions = {}): Promise<void> {
    this.starting = this.launch(options);
    return this.starting;
  }

  private async launch(options: StartOptions): Promise<void> {
    const generation = this.generation;
    let driver: DriverProcess;
    try {
      driver = await DriverProcess.start(this.sandbox, {
        language: this.info.language,
        contextId: this.info.id,
        cwd: this.info.cwd,
        env: this.env,
        timeoutMs: options.timeoutMs ?? DEFAULT_START_TIMEOUT_MS,
        signal: options.signal,
        label: driverLabel({
          contextId: this.info.id, language: this.info.language, cwd: this.info.cwd, isDefault: this.isDefault,
          ...(this.envVars ? { envVars: this.envVars } : {}), startedAt: new Date().toISOString(),
        }),
      });
    } catch (error) {
      this.deadReason = `starting its interpreter failed: ${(error as Error).message}`;
      throw error;
    }
    if (this.isClosed || generation !== this.generation) {
      await driver.stop(STOP_GRACE_MS);
      return;
    }
    this.attach(driver);
    this.driver = driver;
    this.deadReason = undefined;
  }

  /** Runs code after any earlier run of this context finished. */
  run(code: string, options: RunCodeOptions = {}): Promise<Execution> {
    const task = (): Promise<Execution> => this.execute(code, options);
    const next = this.queue.then(task, task);
    this.queue = next.catch(() => undefined);
    return next;
  }

  /** Kills the interpreter (whatever runs is ended) and starts a fresh one: all state is lost. */
  restart(options: StartOptions = {}): Promise<void> {
    this.checkOpen();
    this.generation += 1;
    const old = this.driver;
    this.driver = undefined;
    const previous = this.starting;
    const generation = this.generation;
    // Runs queued behind the restart wait for this and then use the fresh interpreter.
    this.starting = (async () => {
      await previous?.catch(() => undefined);
      // A live Python driver restarts its kernel in place; anything else gets a new driver.
      if (old && (await old.restartInterpreter(options.timeoutMs ?? DEFAULT_START_TIMEOUT_MS))) {
        if (!this.isClosed && generation === this.generation) {
          this.driver = old;
          this.deadReason = undefined;
          return;
        }
      }
      if (old) await old.stop(STOP_GRACE_MS);
      await this.launch(options);
    })();
    return this.starting;
  }

  /** Shuts the interpreter down. Safe to call twice. */
  async close(): Promise<void> {
    if (this.isClosed) return;
    this.isClosed = true;
    this.generation += 1;
    const old = this.driver;
    this.driver = undefined;
    await this.starting?.catch(() => undefined);
    if (old) await old.stop(STOP_GRACE_MS);
  }

  private attach(driver: DriverProcess): void {
    driver.onEvent((event) => this.dispatch(event));
    // Output of processes the JavaScript code started with inherited stdio; the Python driver's
    // own stderr is diagnostics, kept in its tail.
    if (this.info.language !== 'python') driver.onStderr((text) => this.current?.builder.output('stderr', text));
    void driver.exited.then((exit) => {
      // A run on this driver ends with it, also when a restart or close already replaced it.
      if (this.current?.driver === driver) this.current.settle({ how: 'exited', exit });
      if (this.driver !== driver) return;
      this.driver = undefined;
      if (!this.isClosed) this.deadReason ??= `its interpreter exited (${exit.signal ?? `exit code ${exit.exitCode}`})`;
    });
  }

  private dispatch(event: DriverEvent): void {
    const running = this.current;
    if (running !== undefined && event.type === 'fatal') running.builder.output('stderr', `capsule: interpreter driver: ${event.message}\n`);
    if (running === undefined || !('id' in event) || event.id !== running.id) return;
    if (event.type === 'end') running.settle(event.outcome === 'died' || event.outcome === 'restarted' ? { how: 'died' } : { how: 'end' });
    else running.builder.apply(event);
  }

  private checkOpen(): void {
    if (this.isClosed) {
      throw new SandboxError('NOT_FOUND', `interpreter context ${this.info.id} was deleted`, {
        details: { contextId: this.info.id },
        hint: 'Create a new context (createContext) or run without contextId to use the default one.',
      });
    }
  }

  private async requireDriver(): Promise<DriverProcess> {
    this.checkOpen();
    await this.starting?.catch(() => undefined);
    this.checkOpen();
    if (this.deadReason !== undefined || this.driver === undefined) {
      throw new SandboxError('CONFLICT', `interpreter context ${this.info.id} is not running: ${this.deadReason ?? 'it was stopped'}`, {
        details: { contextId: this.info.id },
        hint: `Restart it (restartContext("${this.info.id}")); its earlier state is gone.`,
      });
    }
    return this.driver;
  }

  private async execute(code: string, options: RunCodeOptions): Promise<Execution> {
    options.signal?.throwIfAborted();
    const driver = await this.requireDriver();
    const limits = this.sandbox.spec.limits;
    const timeoutMs = options.timeoutMs ?? limits.wallClockMs;
    const id = `${this.epoch}-${++this.sequence}`;
    const builder = new ExecutionBuilder(this.info.id, { stdoutBytes: limits.stdoutBytes, stderrBytes: limits.stderrBytes }, options);
    let source = code;
    if (this.info.language === 'ts') {
      const stripped = await this.stripper.strip(code, `cell-${id}`);
      if ('error' in stripped) {
        builder.apply({ type: 'error', id, ...stripped.error });
        return builder.execution;
      }
      source = stripped.code;
    }

    const generation = this.generation;
    const before = await this.sandbox.counters().catch(() => undefined);
    const started = performance.now();
    const running: Running = { id, driver, builder, settle: () => undefined };
    const settled = new Promise<Settled>((settle) => (running.settle = settle));
    this.current = running;
    let timedOut = false;
    let aborted = false;
    let escalated = false;
    let graceTimer: NodeJS.Timeout | undefined;
    let breakTimer: NodeJS.Timeout | undefined;
    const interrupt = (): void => {
      if (graceTimer !== undefined) return;
      driver.interrupt(id);
      breakTimer = setTimeout(() => driver.breakSync(), BREAK_SYNC_DELAY_MS);
      graceTimer = setTimeout(() => {
        escalated = true;
        void driver.kill();
      }, INTERRUPT_GRACE_MS);
    };
    const timer = setTimeout(() => {
      timedOut = true;
      interrupt();
    }, timeoutMs);
    const onAbort = (): void => {
      aborted = true;
      interrupt();
    };
    options.signal?.addEventListener('abort', onAbort, { once: true });
    try {
      driver.send({ op: 'execute', id, code: source, ...(options.envVars && { envVars: options.envVars }) });
    } catch {
      running.settle({ how: 'exited', exit: await driver.exited });
    }
    const outcome = await settled;
    clearTimeout(timer);
    clearTimeout(breakTimer);
    clearTimeout(graceTimer);
    // A SIGINT that reached Node outside the code (a rare race) ended the driver: as if killed.
    if (graceTimer !== undefined && outcome.how === 'exited' && outcome.exit.signal === 'SIGINT') escalated = true;
    options.signal?.removeEventListener('abort', onAbort);
    this.current = undefined;
    const durationMs = Math.round(performance.now() - started);
    const execution = builder.execution;

    if (outcome.how !== 'end') {
      const crashed = (): SandboxError =>
        new SandboxError('SANDBOX_CRASHED', `sandbox ${this.sandbox.id} stopped while context ${this.info.id} ran code`, {
          details: { contextId: this.info.id },
        });
      if (outcome.how === 'exited' && outcome.exit.lost) throw crashed();
      this.checkOpen();
      if (generation !== this.generation) {
        execution.error = { name: 'ContextRestarted', value: `context ${this.info.id} was restarted while the code ran`, traceback: '' };
        return execution;
      }
      const after = await this.sandbox.counters().catch(() => undefined);
      if (escalated) {
        await this.restart();
        if (!aborted) execution.limit = timeoutLimit(this.info.id, timeoutMs, durationMs, true);
      } else if (before !== undefined && after !== undefined && after.oomKills > before.oomKills) {
        execution.limit = memoryLimit(this.info.id, this.info.language, limits.memoryBytes, after.memoryPeakBytes);
        this.deadReason = `the memory limit ended its interpreter (${execution.limit.message.split(';')[0]})`;
      } else if (outcome.how === 'exited' && (await this.sandboxGone())) {
        throw crashed();
      } else {
        this.deadReason ??= 'its interpreter ended unexpectedly';
        execution.error = {
          name: 'ContextDied',
          value: `the ${this.info.language} interpreter of context ${this.info.id} ended unexpectedly; restart the context to go on`,
          traceback: this.driverTail(driver),
        };
      }
    } else if (timedOut) {
      execution.limit = timeoutLimit(this.info.id, timeoutMs, durationMs, false);
    }
    if (aborted) {
      throw new SandboxError('ABORTED', `the caller aborted the code running in context ${this.info.id}; it was interrupted`, {
        details: { contextId: this.info.id, stateLost: escalated },
      });
    }
    return execution;
  }

  /**
   * Whether the sandbox itself is going away. Its agent reports the kills of its processes
   * before it exits, so a driver's exit can arrive just before `lost`: wait for it briefly.
   */
  private async sandboxGone(): Promise<boolean> {
    let timer: NodeJS.Timeout | undefined;
    const gone = await Promise.race([
      this.sandbox.lost.then(() => true),
      new Promise<boolean>((resolve) => (timer = setTimeout(() => resolve(false), SANDBOX_LOST_WAIT_MS))),
    ]);
    clearTimeout(timer);
    return gone;
  }

  private driverTail(driver: DriverProcess): string {
    return driver.stderrTail.trim().split('\n').slice(-20).join('\n');
  }
}
