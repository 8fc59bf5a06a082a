import { SandboxError } from '../../errors/index.js';
import type { BackendSandbox } from '../../backends/backend.js';
import type { AgentExit, AgentProcess } from '../../backends/agent/index.js';
import { TOOLS_DIR } from '../../host/sandbox-layout.js';
import { LineDecoder, parseEvent, type DriverEvent, type DriverRequest } from './protocol.js';
import type { InterpreterLanguage } from '../../wire/index.js';

const STDERR_TAIL_CHARS = 4096;

/**
 * Starts Node for a JavaScript context (a constant program; the context id is an argument). The
 * driver gets the protocol on fd 3 and its fds 1 and 2 on the agent's stderr. Node runs in its own
 * process group under this small parent that ignores SIGINT: the agent signals the leader's group
 * and then each process of its session, so a session leader would get every SIGINT twice, and a
 * second one landing between two executions would end Node or break the next execution.
 */
const JS_LAUNCHER = `
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
pid = os.fork()
if pid == 0:
    os.setpgid(0, 0)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.dup2(1, 3)
    os.dup2(2, 1)
    os.execvp("node", ["node", "${TOOLS_DIR}/js_driver.mjs"] + sys.argv[1:])
while True:
    try:
        _, status = os.waitpid(pid, 0)
        break
    except InterruptedError:
        pass
if os.WIFSIGNALED(status):
    signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
    os.kill(os.getpid(), os.WTERMSIG(status))
sys.exit(os.WEXITSTATUS(status))
`;

/** The argv that starts a context's driver inside the sandbox. */
export function driverArgv(language: InterpreterLanguage, contextId: string, cwd: string): string[] {
  if (language === 'python') {
    return ['python3', `${TOOLS_DIR}/python_driver.py`, '--context', contextId, '--cwd', cwd];
  }
  return ['python3', '-c', JS_LAUNCHER, '--context', contextId];
}

export interface DriverStartOptions {
  language: InterpreterLanguage;
  contextId: string;
  cwd: string;
  env: Record<string, string>;
  timeoutMs: number;
  signal?: AbortSignal;
  /** What the agent keeps of the driver for a server that reattaches (see driverLabel). */
  label?: string;
}

/** What a driver's agent label says of its context, so a server that reattaches can adopt it. */
export interface DriverMeta {
  contextId: string;
  language: InterpreterLanguage;
  cwd: string;
  /** The context is its language's default (runCode without a contextId). */
  isDefault: boolean;
  /** The envVars the context was created with (a restart of the context starts from them). */
  envVars?: Record<string, string>;
  startedAt: string;
}

/** The label a driver is started with (AgentStartOptions.label, at most 16 KiB): its context. */
export function driverLabel(meta: DriverMeta): string {
  const label = JSON.stringify({ interpreter: meta });
  // A context made with more envVars than a label holds is still adopted; a restart of it then
  // starts without them.
  return Buffer.byteLength(label) <= 16 * 1024 ? label : JSON.stringify({ interpreter: { ...meta, envVars: undefined } });
}

/** The context a process's label names, when it is an interpreter driver; else undefined. */
export function parseDriverLabel(label: string | undefined): DriverMeta | undefined {
  if (label === undefined || !label.startsWith('{"interpreter"')) return undefined;
  try {
    const meta = (JSON.parse(label) as { interpreter?: Partial<DriverMeta> }).interpreter;
    if (typeof meta?.contextId !== 'string' || typeof meta.cwd !== 'string' || !['python', 'js', 'ts'].includes(meta.language ?? '')) return undefined;
    return {
      contextId: meta.contextId,
      language: meta.language as InterpreterLanguage,
      cwd: meta.cwd,
      isDefault: meta.isDefault === true,
      startedAt: typeof meta.startedAt === 'string' ? meta.startedAt : new Date(0).toISOString(),
      ...(meta.envVars !== undefined && typeof meta.envVars === 'object' ? { envVars: meta.envVars } : {}),
    };
  } catch {
    return undefined;
  }
}

/** One running driver process: requests in, parsed events out. */
export class DriverProcess {
  private readonly listeners: ((event: DriverEvent) => void)[] = [];
  private readonly stderrListeners: ((text: string) => void)[] = [];
  private tail = '';

  private constructor(
    private readonly process: AgentProcess,
    readonly language: InterpreterLanguage,
    adopted = false,
  ) {
    const lines = new LineDecoder();
    // An adopted driver's stream may begin inside a line the previous server half read.
    let resyncing = adopted;
    process.onStdout((chunk) => {
      for (const line of lines.push(chunk)) {
        let event: DriverEvent;
        try {
          event = parseEvent(line);
          resyncing = false;
        } catch (error) {
          if (resyncing) continue;
          event = { type: 'fatal', message: `the driver wrote an unreadable line: ${(error as Error).message}` };
        }
        for (const listener of this.listeners) listener(event);
      }
    });
    process.onStderr((chunk) => {
      const text = chunk.toString('utf8');
      this.tail = (this.tail + text).slice(-STDERR_TAIL_CHARS);
      for (const listener of this.stderrListeners) listener(text);
    });
  }

  /** Starts the driver and waits for its `ready`; a `fatal` or an early exit is EXEC_FAILED. */
  static async start(sandbox: BackendSandbox, options: DriverStartOptions): Promise<DriverProcess> {
    options.signal?.throwIfAborted();
    const process = await sandbox.exec({
      argv: driverArgv(options.language, options.contextId, options.cwd),
      env: options.env,
      cwd: options.cwd,
      stdin: true,
      ...(options.label !== undefined ? { label: options.label } : {}),
    });
    const driver = new DriverProcess(process, options.language);
    let timer: NodeJS.Timeout | undefined;
    let onAbort: (() => void) | undefined;
    const failure = (message: string, code: 'EXEC_FAILED' | 'TIMEOUT' | 'ABORTED' = 'EXEC_FAILED'): SandboxError =>
      new SandboxError(code, `cannot start the ${options.language} interpreter for context ${options.contextId} in sandbox ${sandbox.id}: ${message}`, {
        details: { contextId: options.contextId, language: options.language, stderr: driver.stderrTail },
        hint: code === 'TIMEOUT'
          ? 'The sandbox may be short of CPU or memory; raise limits.cpus or limits.memoryBytes, or try again.'
          : 'Check that the sandbox image has the interpreter (python3 with ipykernel, or node) and enough memory (limits.memoryBytes).',
      });
    try {
      await new Promise<void>((resolve, reject) => {
        driver.onEvent((event) => {
          if (event.type === 'ready') resolve();
          if (event.type === 'fatal') reject(failure(event.message));
        });
        void process.exited.then((exit) => reject(failure(`the driver exited (${describeExit(exit)}) ${lastLine(driver.stderrTail)}`.trim())));
        timer = setTimeout(() => reject(failure(`no answer within ${options.timeoutMs} ms`, 'TIMEOUT')), options.timeoutMs);
        onAbort = () => reject(failure('the caller aborted', 'ABORTED'));
        options.signal?.addEventListener('abort', onAbort, { once: true });
      });
    } catch (error) {
      await driver.kill();
      throw error;
    } finally {
      clearTimeout(timer);
      if (onAbort) options.signal?.removeEventListener('abort', onAbort);
    }
    return driver;
  }

  /** A driver an earlier server started, from its agent process after a reattach: ready already. */
  static adopt(process: AgentProcess, language: InterpreterLanguage): DriverProcess {
    return new DriverProcess(process, language, true);
  }

  get exited(): Promise<AgentExit> {
    return this.process.exited;
  }

  get stderrTail(): string {
    return this.tail;
  }

  /** Calls `listener` for every event; returns a function that removes it. */
  onEvent(listener: (event: DriverEvent) => void): () => void {
    this.listeners.push(listener);
    return () => {
      const index = this.listeners.indexOf(listener);
      if (index >= 0) this.listeners.splice(index, 1);
    };
  }

  /**
   * Python only: restarts the kernel inside this driver (cheaper than a new driver). Resolves
   * false when the driver reports a failure, exits or does not answer within `timeoutMs`.
   */
  async restartInterpreter(timeoutMs: number): Promise<boolean> {
    if (this.language !== 'python') return false;
    let timer: NodeJS.Timeout | undefined;
    let unsubscribe = (): void => undefined;
    try {
      return await new Promise<boolean>((resolve) => {
        unsubscribe = this.onEvent((event) => {
          if (event.type === 'restarted') resolve(true);
          if (event.type === 'fatal') resolve(false);
        });
        void this.process.exited.then(() => resolve(false));
        timer = setTimeout(() => resolve(false), timeoutMs);
        try {
          this.send({ op: 'restart' });
        } catch {
          resolve(false);
        }
      });
    } finally {
      clearTimeout(timer);
      unsubscribe();
    }
  }

  /** Text the driver's process tree wrote to fds 1/2 outside the protocol. */
  onStderr(listener: (text: string) => void): void {
    this.stderrListeners.push(listener);
  }

  send(request: DriverRequest): void {
    this.process.write(`${JSON.stringify(request)}\n`);
  }

  /** Asks the driver to interrupt: Python interrupts its kernel; Node abandons a pending await. */
  interrupt(executionId: string): void {
    try {
      this.send({ op: 'interrupt', id: executionId });
    } catch {
      // already gone: its exit settles whatever ran
    }
  }

  /**
   * Node only: SIGINT breaks synchronous code (vm breakOnSigint). Sent only while the driver does
   * not answer, i.e. its event loop is blocked in the code: outside that, a SIGINT in the instant
   * before the REPL arms its watchdog would end the driver.
   */
  breakSync(): void {
    if (this.language !== 'python') this.process.signal('SIGINT');
  }

  /** Asks the driver to shut its interpreter down; kills it after `graceMs`. */
  async stop(graceMs: number): Promise<void> {
    try {
      this.send({ op: 'shutdown' });
      this.process.closeStdin();
    } catch {
      // gone already
    }
    let timer: NodeJS.Timeout | undefined;
    const timedOut = new Promise<'timeout'>((resolve) => (timer = setTimeout(() => resolve('timeout'), graceMs)));
    const how = await Promise.race([this.process.exited, timedOut]);
    clearTimeout(timer);
    if (how === 'timeout') await this.kill();
  }

  /** SIGKILL to the driver's tree; the Python kernel dies with it (PR_SET_PDEATHSIG). */
  async kill(): Promise<void> {
    this.process.signal('SIGKILL');
    await this.process.exited;
  }
}

function describeExit(exit: AgentExit): string {
  if (exit.lost) return 'the sandbox agent went away';
  return exit.signal !== null ? `signal ${exit.signal}` : `exit code ${exit.exitCode}`;
}

function lastLine(text: string): string {
  const lines = text.trim().split('\n');
  return lines.length > 0 && lines[lines.length - 1] !== '' ? `: ${lines[lines.length - 1]}` : '';
}
