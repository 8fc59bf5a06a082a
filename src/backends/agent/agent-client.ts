/**
 * Host side of the agent protocol: drives one `capsule-agent` over its stdin/stdout. It does no
 * spawning itself; the backend hands it the two streams of whatever launched the agent.
 */
import { constants as osConstants } from 'node:os';
import { SandboxError } from '../../errors/index.js';
import {
  FrameDecoder,
  FrameType,
  MAX_PAYLOAD_BYTES,
  decodeDropped,
  decodeExit,
  decodeListReply,
  decodeStartFailed,
  decodeStarted,
  encodeFrame,
  encodeResize,
  encodeSignal,
  encodeStart,
  type Frame,
  type ListedProcess,
} from './protocol.js';
import { RelayTable, type AgentRelay } from './relay.js';

export interface AgentStartOptions {
  /** Program and arguments; argv[0] is looked up in `env.PATH` when it has no slash. */
  argv: string[];
  /** The complete environment of the child: nothing is inherited from the agent. */
  env: Record<string, string>;
  /** Absolute working directory inside the sandbox. */
  cwd: string;
  /** Give the child a pipe the host writes to. @default false (stdin is /dev/null) */
  stdin?: boolean;
  /** Run on a fresh pseudo-terminal (stdin, stdout and stderr); output arrives as stdout. */
  pty?: { cols: number; rows: number };
  /** Run as this user of the sandbox (a sandbox from a template only); see StartRequest.user. */
  user?: string;
  /** The host's own record of the process, kept by the agent for a later client (StartRequest.label). */
  label?: string;
}

export interface AgentExit {
  /** Set when the process exited. */
  exitCode: number | null;
  /** Set when a signal killed the process. A signal Node has no name for reports exitCode 128+n. */
  signal: NodeJS.Signals | null;
  /** True when the agent went away before reporting the exit. */
  lost: boolean;
}

export interface AgentProcess {
  readonly id: number;
  /** The pid as seen inside the sandbox. */
  readonly pid: number;
  /** The label it was started with (AgentStartOptions.label), also after a reattach. */
  readonly label?: string;
  /** Resolves once, after all output was delivered; never rejects. */
  readonly exited: Promise<AgentExit>;
  /** Output arriving before the first listener is kept and handed to that listener. */
  onStdout(listener: (chunk: Buffer) => void): void;
  onStderr(listener: (chunk: Buffer) => void): void;
  /** Throws SandboxError('PROCESS_NOT_FOUND') after exit. */
  write(data: Buffer | string): void;
  closeStdin(): void;
  /** No-op after exit. */
  signal(signal: NodeJS.Signals | number): void;
  resize(cols: number, rows: number): void;
  /**
   * Stops (true) or continues (false) reading the agent's output while the caller cannot keep up
   * (its log is behind the disk): the agent, and with it every process of the sandbox, waits on
   * its pipe. Ends with the process.
   */
  throttle?(paused: boolean): void;
}

/** A stream of output chunks that keeps what arrives before anyone listens. */
class OutputChannel {
  private readonly listeners: ((chunk: Buffer) => void)[] = [];
  private early: Buffer[] = [];

  add(listener: (chunk: Buffer) => void): void {
    this.listeners.push(listener);
    if (this.listeners.length === 1) {
      const early = this.early;
      this.early = [];
      for (const chunk of early) listener(chunk);
    }
  }

  emit(chunk: Buffer): void {
    if (this.listeners.length === 0) this.early.push(chunk);
    for (const listener of this.listeners) listener(chunk);
  }
}

class RunningProcess implements AgentProcess {
  pid = 0;
  label: string | undefined;
  readonly exited: Promise<AgentExit>;
  readonly stdout = new OutputChannel();
  readonly stderr = new OutputChannel();
  hasExited = false;
  private stdinOpen: boolean;
  private settle!: (exit: AgentExit) => void;
  /** How this process pauses the output of its agent (bound by the client that reads it). */
  pauseOutput: (paused: boolean) => void = () => undefined;

  constructor(
    readonly id: number,
    private readonly argv0: string,
    private readonly isPty: boolean,
    hasStdin: boolean,
    private send: (type: number, id: number, payload?: Buffer) => void,
  ) {
    this.stdinOpen = hasStdin || isPty;
    this.exited = new Promise((resolve) => (this.settle = resolve));
  }

  /** What a later client needs to take this process over from a file (a restart in between). */
  record(): AgentProcessRecord {
    return { id: this.id, pid: this.pid, argv0: this.argv0, isPty: this.isPty, hasStdin: this.stdinOpen, ...(this.label !== undefined ? { label: this.label } : {}) };
  }

  /** Sends through another client from now on (the agent was handed over to it). */
  rebind(send: (type: number, id: number, payload?: Buffer) => void): void {
    this.send = send;
  }

  finish(exit: AgentExit): void {
    if (this.hasExited) return;
    this.hasExited = true;
    this.pauseOutput(false);
    this.settle(exit);
  }

  throttle(paused: boolean): void {
    if (!this.hasExited || !paused) this.pauseOutput(paused);
  }

  onStdout(listener: (chunk: Buffer) => void): void {
    this.stdout.add(listener);
  }

  onStderr(listener: (chunk: Buffer) => void): void {
    this.stderr.add(listener);
  }

  write(data: Buffer | string): void {
    if (this.hasExited) {
      throw new SandboxError('PROCESS_NOT_FOUND', `process ${this.argv0} (pid ${this.pid}) has exited; its stdin is gone`, {
        details: { id: this.id, pid: this.pid },
      });
    }
    if (!this.stdinOpen) {
      throw new SandboxError('INVALID_ARGUMENT', `stdin of ${this.argv0} is closed or was never opened`, {
        details: { id: this.id },
        hint: 'Start the process with stdin: true (or pty) and write before closeStdin().',
      });
    }
    const bytes = typeof data === 'string' ? Buffer.from(data) : data;
    // An empty write sends nothing: a zero-length INPUT would be a wasted frame, not an EOF.
    for (let offset = 0; offset < bytes.length; offset += MAX_PAYLOAD_BYTES) {
      this.send(FrameType.Input, this.id, bytes.subarray(offset, offset + MAX_PAYLOAD_BYTES));
    }
  }

  closeStdin(): void {
    if (this.hasExited || !this.stdinOpen) return;
    // A pty stays writable: the agent sends EOT, which ends one read, not the terminal.
    if (!this.isPty) this.stdinOpen = false;
    this.send(FrameType.CloseStdin, this.id);
  }

  signal(signal: NodeJS.Signals | number): void {
    const number = typeof signal === 'number' ? signal : osConstants.signals[signal];
    if (number === undefined) {
      throw new SandboxError('INVALID_ARGUMENT', `unknown signal ${String(signal)}`, { details: { signal } });
    }
    const payload = encodeSignal(number);
    if (!this.hasExited) this.send(FrameType.Signal, this.id, payload);
  }

  resize(cols: number, rows: number): void {
    const payload = encodeResize(cols, rows);
    if (!this.hasExited && this.isPty) this.send(FrameType.Resize, this.id, payload);
  }
}

interface PendingStart {
  proc: RunningProcess;
  argv0: string;
  resolve: (process: AgentProcess) => void;
  reject: (error: SandboxError) => void;
}

interface PendingPing {
  resolve: () => void;
  reject: (error: SandboxError) => void;
  timer: NodeJS.Timeout;
}

const signalNames = new Map<number, NodeJS.Signals>(
  Object.entries(osConstants.signals).map(([name, number]) => [number, name as NodeJS.Signals]),
);

export interface AgentClientOptions {
  /**
   * First process id this client assigns. A client that takes over an agent that already runs
   * processes (a gVisor sandbox restored from a checkpoint: same agent, new pipes, no second
   * READY) starts past the ids the agent still tracks. @default 1
   */
  firstProcessId?: number;
  /** Processes of a previous client of the same agent, from its `handOver()`; they continue here. */
  handOver?: AgentHandOver;
  /**
   * Processes a client in an earlier Capsule process started (from `handOver().records`): new
   * handles for them are made here (see `processes()`); output they wrote meanwhile is gone.
   */
  adopt?: readonly AgentProcessRecord[];
  /**
   * The agent is held by a supervisor (capsule-launch --supervise) that outlives this client: it
   * ended its stream once; `close()` sends QUIT to end the sandbox's work, `detach()` leaves it
   * running. @default false
   */
  supervised?: boolean;
  /**
   * Take over a supervised agent that an earlier client (an earlier Capsule process) started:
   * no READY comes; the client asks LIST, makes handles for what runs (and what ended while no
   * client listened), then replays the frames the supervisor spooled meanwhile. `ready`
   * resolves once that is done. @default false
   */
  reattach?: boolean;
}

/** The id of the LIST a reattaching client sends; process ids never reach it. */
const REATTACH_LIST_ID = 0xfffffff0;

/** What one client passes to the next one that talks to the same agent over new pipes. */
export interface AgentHandOver {
  nextProcessId: number;
  processes: readonly AgentProcess[];
  /** The same processes as plain data, for a client in another Capsule process (JSON-safe). */
  records: readonly AgentProcessRecord[];
}

/** A running process of an agent, as plain data: enough to reattach to its stdio and exit. */
export interface AgentProcessRecord {
  id: number;
  pid: number;
  argv0: string;
  isPty: boolean;
  hasStdin: boolean;
  /** What the host started it as (AgentStartOptions.label), for the process list of a later client. */
  label?: string;
}

/** Drives one agent: start processes, stream their output, learn how they ended. */
export class AgentClient {
  /** Resolves on the agent's READY; rejects with SANDBOX_CRASHED if its stream ends first. */
  readonly ready: Promise<void>;
  private readonly decoder = new FrameDecoder();
  private readonly starting = new Map<number, PendingStart>();
  private readonly running = new Map<number, RunningProcess>();
  private readonly pings = new Map<number, PendingPing>();
  private readonly relays: RelayTable;
  private readonly lostListeners: ((reason: SandboxError) => void)[] = [];
  private lostReason: SandboxError | null = null;
  /** Processes whose readers asked to pause the agent's output. */
  private readonly pausing = new Set<number>();
  private isClosed = false;
  private isHandingOver = false;
  private nextProcessId = 1;
  private nextPingId = 1;
  /** While reattaching: frames that arrived before the LIST answer ended, and that answer. */
  private held: Frame[] | null = null;
  private listed: ListedProcess[] = [];
  private readonly tookOver: RunningProcess[] = [];
  private readonly supervised: boolean;
  /** Output bytes the supervisor dropped while no client listened (its spool was full). */
  droppedBytes = 0;
  private markReady!: () => void;
  private failReady!: (error: SandboxError) => void;

  constructor(
    private readonly toAgent: NodeJS.WritableStream,
    private readonly fromAgent: NodeJS.ReadableStream,
    options: AgentClientOptions = {},
  ) {
    this.nextProcessId = options.handOver?.nextProcessId ?? options.firstProcessId ?? 1;
    this.relays = new RelayTable((type, id, payload) => this.send(type, id, payload));
    // An agent that served another client (a restored checkpoint) may hold that client's relays:
    // they end before this one opens any, so no frame of theirs is taken for one of ours.
    if (options.handOver || options.adopt || options.firstProcessId !== undefined) this.send(FrameType.RelayClose, 0, Buffer.from([0]));
    this.supervised = options.supervised === true || options.reattach === true;
    for (const proc of options.handOver?.processes ?? []) {
      if (!(proc instanceof RunningProcess) || proc.hasExited) continue;
      proc.rebind((type, id, data) => this.send(type, id, data));
      proc.pauseOutput = (paused) => this.pauseOutput(proc.id, paused);
      this.running.set(proc.id, proc);
    }
    for (const record of options.adopt ?? []) {
      if (this.running.has(record.id)) continue;
      const proc = new RunningProcess(record.id, record.argv0, record.isPty, record.hasStdin, (type, id, data) => this.send(type, id, data));
      proc.pid = record.pid;
      proc.label = record.label;
      proc.pauseOutput = (paused) => this.pauseOutput(record.id, paused);
      this.running.set(record.id, proc);
      this.nextProcessId = Math.max(this.nextProcessId, record.id + 1);
    }
    this.ready = new Promise<void>((resolve, reject) => {
      this.markReady = resolve;
      this.failReady = reject;
    });
    // Callers who only use start() never await ready; its rejection is not an unhandled one.
    this.ready.catch(() => undefined);
    fromAgent.on('data', (chunk: Buffer | string) => this.receive(typeof chunk === 'string' ? Buffer.from(chunk) : chunk));
    fromAgent.on('end', () => this.lose(crashed('the agent closed its output')));
    fromAgent.on('close', () => this.lose(crashed('the agent output stream closed')));
    fromAgent.on('error', (error: Error) => this.lose(crashed(`reading from the agent failed: ${error.message}`, error)));
    // EPIPE when the agent is gone; its output ending says the same thing, whichever comes first.
    toAgent.on('error', (error: Error) => this.lose(crashed(`writing to the agent failed: ${error.message}`, error)));
    if (options.reattach === true) {
      this.held = [];
      this.toAgent.write(encodeFrame(FrameType.List, REATTACH_LIST_ID));
    }
  }

  private pauseOutput(id: number, paused: boolean): void {
    if (paused) this.pausing.add(id);
    else this.pausing.delete(id);
    if (this.pausing.size > 0) this.fromAgent.pause();
    else if (this.fromAgent.isPaused()) this.fromAgent.resume();
  }

  /** The id the next start() uses; a client taking over the same agent later starts here. */
  get nextStartId(): number {
    return this.nextProcessId;
  }

  get isAlive(): boolean {
    return this.lostReason === null;
  }

  /** Called once when the agent's stream ends or breaks, with the reason. */
  onLost(listener: (reason: SandboxError) => void): void {
    if (this.lostReason !== null) listener(this.lostReason);
    else this.lostListeners.push(listener);
  }

  start(options: AgentStartOptions): Promise<AgentProcess> {
    return new Promise<AgentProcess>((resolve, reject) => {
      const payload = encodeStart(options);
      this.checkUsable();
      const id = this.nextProcessId++;
      const argv0 = options.argv[0] ?? '';
      const proc = new RunningProcess(id, argv0, options.pty !== undefined, options.stdin === true, (type, frameId, data) =>
        this.send(type, frameId, data),
      );
      proc.pauseOutput = (paused) => this.pauseOutput(id, paused);
      proc.label = options.label;
      this.starting.set(id, { proc, argv0, resolve, reject });
      this.send(FrameType.Start, id, payload);
    });
  }

  /**
   * Connects to `port` on the sandbox's own loopback through the agent (127.0.0.1, then ::1):
   * works without any network in the sandbox. PORT_NOT_LISTENING when nothing accepts there.
   */
  connectPort(port: number, options: { signal?: AbortSignal; timeoutMs?: number } = {}): Promise<AgentRelay> {
    try {
      this.checkUsable();
    } catch (error) {
      return Promise.reject(error instanceof Error ? error : new Error(String(error)));
    }
    return this.relays.connect(port, options);
  }

  /** Round-trips a PING; rejects with TIMEOUT after `timeoutMs`. @default timeoutMs 5000 */
  ping(timeoutMs = 5000): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      this.checkUsable();
      const id = this.nextPingId++;
      const timer = setTimeout(() => {
        this.pings.delete(id);
        reject(new SandboxError('TIMEOUT', `the agent did not answer a ping within ${timeoutMs} ms`, { details: { timeoutMs } }));
      }, timeoutMs);
      this.pings.set(id, { resolve, reject, timer });
      this.send(FrameType.Ping, id);
    });
  }

  /**
   * The agent's stream is about to end while the agent lives on (a gVisor checkpoint): when it
   * ends, running processes stay open for `handOver()` instead of ending as lost.
   */
  prepareHandOver(isHandingOver = true): void {
    this.isHandingOver = isHandingOver;
  }

  /** After the stream ended: the processes still running, for the next client of this agent. */
  handOver(): AgentHandOver {
    const processes = [...this.running.values()];
    this.running.clear();
    return { nextProcessId: this.nextProcessId, processes, records: processes.map((p) => p.record()) };
  }

  /**
   * After a reattach: every process the agent listed, the running ones and those that ended while
   * no client listened (their output and exit replayed from the supervisor's spool).
   */
  reattached(): AgentProcess[] {
    return [...this.tookOver];
  }

  /** Processes this client tracks that have not exited (started here, handed over or adopted). */
  processes(): AgentProcess[] {
    return [...this.running.values()];
  }

  /** Ends the agent's stdin: the agent kills every process tree, reports their exits and exits. */
  close(): void {
    if (this.isClosed) return;
    // A supervised agent outlives its stream: ask it to end its work first.
    if (this.supervised && this.lostReason === null) this.toAgent.write(encodeFrame(FrameType.Quit, 0));
    this.isClosed = true;
    this.toAgent.end();
  }

  /**
   * Lets go of a supervised agent that keeps running (the server stops, the sandbox does not):
   * its processes stay open for `handOver()`, nothing ends in the sandbox.
   */
  detach(): void {
    if (this.isClosed) return;
    this.isHandingOver = true;
    this.isClosed = true;
    this.toAgent.end();
  }

  private checkUsable(): void {
    if (this.lostReason !== null) throw this.lostReason;
    if (this.isClosed) throw new SandboxError('SANDBOX_NOT_RUNNING', 'the agent client is closed');
  }

  private send(type: number, id: number, payload?: Buffer): void {
    if (this.lostReason !== null || this.isClosed) return;
    this.toAgent.write(encodeFrame(type, id, payload));
  }

  private receive(chunk: Buffer): void {
    if (this.lostReason !== null) return;
    try {
      for (const frame of this.decoder.push(chunk)) {
        if (this.held !== null) this.hold(frame);
        else this.dispatch(frame);
      }
    } catch (error) {
      this.lose(crashed(`the agent broke the protocol: ${(error as Error).message}`, error));
      this.toAgent.end(); // the agent kills its children once its stdin ends
    }
  }

  /** While reattaching: keep frames until the LIST answer is whole, then take over and replay. */
  private hold(frame: Frame): void {
    if (frame.type !== FrameType.ListReply || frame.id !== REATTACH_LIST_ID) {
      this.held?.push(frame);
      return;
    }
    const { more, processes } = decodeListReply(frame.payload);
    this.listed.push(...processes);
    if (more) return;
    const held = this.held ?? [];
    this.held = null;
    for (const listed of this.listed) {
      const proc = new RunningProcess(listed.id, `pid ${listed.pid}`, listed.isPty, listed.hasStdin, (type, id, data) => this.send(type, id, data));
      proc.pid = listed.pid;
      proc.label = listed.label;
      this.running.set(listed.id, proc);
      this.tookOver.push(proc);
      this.nextProcessId = Math.max(this.nextProcessId, listed.id + 1);
    }
    // What the supervisor spooled: output and exits written while no client listened.
    for (const frame of held) this.dispatch(frame);
    // Ended before this client came: the exit the agent remembers, if no spooled EXIT said it.
    for (const listed of this.listed) {
      const proc = this.running.get(listed.id);
      if (listed.exit === undefined || proc === undefined) continue;
      this.running.delete(listed.id);
      proc.finish(toExit(listed.exit));
    }
    this.listed = [];
    this.markReady();
  }

  private dispatch({ type, id, payload }: Frame): void {
    switch (type) {
      case FrameType.Dropped:
        this.droppedBytes += decodeDropped(payload);
        return;
      case FrameType.Ready:
        this.markReady();
        return;
      case FrameType.Started: {
        const pending = this.starting.get(id);
        if (pending === undefined) return;
        this.starting.delete(id);
        pending.proc.pid = decodeStarted(payload).pid;
        this.running.set(id, pending.proc);
        pending.resolve(pending.proc);
        return;
      }
      case FrameType.StartFailed: {
        const pending = this.starting.get(id);
        if (pending === undefined) return;
        this.starting.delete(id);
        const { errno, message } = decodeStartFailed(payload);
        pending.reject(
          new SandboxError('EXEC_FAILED', `cannot start ${pending.argv0}: ${message}`, {
            details: { errno, argv0: pending.argv0 },
            hint: 'Check that the program exists in the sandbox (and is on env.PATH) and that cwd exists.',
          }),
        );
        return;
      }
      case FrameType.Stdout:
        this.running.get(id)?.stdout.emit(payload);
        return;
      case FrameType.Stderr:
        this.running.get(id)?.stderr.emit(payload);
        return;
      case FrameType.Exit: {
        const proc = this.running.get(id);
        if (proc === undefined) return;
        this.running.delete(id);
        proc.finish(toExit(decodeExit(payload)));
        return;
      }
      case FrameType.RelayOpened:
      case FrameType.RelayFromAgent:
      case FrameType.RelayAck:
      case FrameType.RelayClosed:
        this.relays.dispatch({ type, id, payload });
        return;
      case FrameType.Pong: {
        const ping = this.pings.get(id);
        if (ping === undefined) return;
        this.pings.delete(id);
        clearTimeout(ping.timer);
        ping.resolve();
        return;
      }
      default:
        return; // LOG and frame types from a newer agent carry nothing the client acts on
    }
  }

  private lose(reason: SandboxError): void {
    if (this.lostReason !== null) return;
    this.lostReason = reason;
    this.failReady(reason);
    for (const pending of this.starting.values()) pending.reject(reason);
    this.starting.clear();
    if (!this.isHandingOver) {
      for (const proc of this.running.values()) proc.finish({ exitCode: null, signal: null, lost: true });
      this.running.clear();
    }
    for (const ping of this.pings.values()) {
      clearTimeout(ping.timer);
      ping.reject(reason);
    }
    this.pings.clear();
    // Closing the client ends its relays as the agent does, without an error for their readers.
    this.relays.lose(this.isClosed ? undefined : reason);
    for (const listener of this.lostListeners.splice(0)) listener(reason);
  }
}

function crashed(message: string, cause?: unknown): SandboxError {
  return new SandboxError('SANDBOX_CRASHED', message, {
    cause,
    hint: 'The sandbox agent is gone and its processes with it; see the agent stderr, then start a new sandbox.',
  });
}

function toExit({ kind, value }: { kind: 'exited' | 'signaled'; value: number }): AgentExit {
  if (kind === 'exited') return { exitCode: value, signal: null, lost: false };
  const name = signalNames.get(value);
  return name === undefined ? { exitCode: 128 + value, signal: null, lost: false } : { exitCode: null, signal: name, lost: false };
}
