import { SandboxError } from '../errors/index.js';
import { DEFAULT_MAXIMA, parseSpec, type OperatorMaxima, type BackendName, type NetworkPolicyInput, type SandboxSpec } from '../spec/index.js';

export type { NetworkPolicyInput } from '../spec/index.js';
import type { Backend, BackendSandbox } from '../backends/backend.js';
import { createBackends } from '../backends/registry.js';
import { baseEnv } from '../backends/namespace/bwrap-args.js';
import { HostEnvironment } from '../host/host-env.host.js';
import type { VolumeCapacity } from '../host/volume.host.js';
import { assertEnforceable } from './capabilities.js';
import { newSandboxId } from './ids.js';
import { ManagedProcess } from './managed-process.js';
import { superviseExec } from './supervise.js';
import { WarmPool } from './warm-pool.js';
import { InterpreterService } from './interpreter/service.js';
import { ProcessLogs, type LogOwner } from './process-logs.js';
import { WorkspaceCapacity, type WorkspaceBudget } from './disk-budget.js';
import type { AgentProcess } from '../backends/agent/index.js';
import type { ProcessOutput } from './process-output.js';
import type { ExecResult } from './result.js';
import type {
  CreateSandboxCommand,
  ListSandboxesQuery,
  ProcessHandle,
  ProcessInfo,
  SandboxEngine,
  SandboxFiles,
  SandboxInfo,
  SandboxState,
  StartProcessCommand,
} from './types.js';

/** Where sandbox records outlive the process: the server keeps them in SQLite. */
export interface SandboxRecordStore {
  upsert(info: SandboxInfo): void;
  /** Records in a live state (starting, running, paused) — after a crash, what to recover. */
  listLive(): SandboxInfo[];
}

/** Keeps records in memory; for one-process use and tests. */
export class MemoryRecordStore implements SandboxRecordStore {
  private readonly records = new Map<string, SandboxInfo>();
  upsert(info: SandboxInfo): void {
    this.records.set(info.sandboxId, structuredClone(info));
  }
  listLive(): SandboxInfo[] {
    return [...this.records.values()].filter((r) => LIVE_STATES.has(r.state));
  }
}

export type EngineEvent = {
  type: 'sandbox.created' | 'sandbox.expired' | 'sandbox.crashed' | 'sandbox.recovered' | 'sandbox.killed';
  sandbox: SandboxInfo;
  /** On `sandbox.created`: it came from the warm pool. */
  poolWarm?: boolean;
};

export interface SandboxManagerOptions {
  dataDir: string;
  store?: SandboxRecordStore;
  maxima?: OperatorMaxima;
  /** Clock for TTLs. @default Date.now */
  now?: () => number;
  onEvent?: (event: EngineEvent) => void;
  /** Backends by name. @default every backend of the registry on this data dir */
  backends?: Backend[];
  /** The prepared host the backends run on; the engine releases its volume at close. */
  host?: HostEnvironment;
  /**
   * Namespace sandboxes kept started ahead for creates whose spec can share them (no network, no
   * mounts, default start-time limits); each is used once. @default 0
   */
  warmPool?: number;
  /** Builds the file service of a live sandbox (src/engine/files). */
  filesFactory?: (sandbox: BackendSandbox) => SandboxFiles;
  /** Observes each process started through `startProcess` (metrics). Must not throw. */
  processObserver?: ProcessObserver;
  /**
   * Where processes' output is logged and replayed from (`<dataDir>/logs`), and whose disk budget
   * it takes. @default logs under `dataDir`, kept until removed, with no budget
   */
  processLogs?: ProcessLogs;
  /** Where tenants' workspaces are charged (their disk quota). @default nothing is charged */
  workspaceBudget?: WorkspaceBudget;
  /**
   * How far the disk limits of live sandboxes may exceed what the workspace volume can back
   * (1: never; a create that does not fit is refused with CAPACITY_EXHAUSTED). @default 1
   */
  diskOvercommit?: number;
}

/** Which process a `ProcessObserver` call is about. */
export interface ObservedProcess {
  tenantId: string;
  sandboxId: string;
  backend: string;
  pid: number;
}

/**
 * Hooks on the processes of `startProcess`: its start and its settled result (whose output fields
 * are empty: the output is in the process's log). Called synchronously; errors are the observer's.
 */
export interface ProcessObserver {
  onProcessStart?(process: ObservedProcess): void;
  onExecResult?(process: ObservedProcess, result: ExecResult): void;
}

/** A network policy as a caller writes it (defaults filled by the spec's schema). */

const LIVE_STATES: ReadonlySet<SandboxState> = new Set(['starting', 'running', 'paused']);
/** Ended processes kept per sandbox for late reattach. */
const MAX_ENDED_PROCESSES = 100;

interface Live {
  info: SandboxInfo;
  /** The disk quota its creator's key has (undefined: the operator's, and after a restart). */
  quotaBytes?: number;
  /** Gives back its workspace's disk limit to the volume and the tenant's quota; once. */
  releaseDisk?: () => void;
  sandbox?: BackendSandbox;
  processes: Map<number, ManagedProcess>;
  files?: SandboxFiles;
  timer?: NodeJS.Timeout;
  ending?: Promise<void>;
}

/**
 * Durable sandboxes: lifecycle (create → running → killed/expired/failed), TTLs, processes with
 * replayable event logs, and recovery after a crash. Thin callers (HTTP routes, the E2B facade)
 * turn requests into calls here.
 */
export class SandboxManager implements SandboxEngine {
  private readonly sandboxes = new Map<string, Live>();
  private readonly backends: Map<BackendName, Backend>;
  private readonly store: SandboxRecordStore;
  private readonly maxima: OperatorMaxima;
  private readonly now: () => number;
  private readonly onEvent: (event: EngineEvent) => void;
  private readonly filesFactory: ((sandbox: BackendSandbox) => SandboxFiles) | undefined;
  private readonly observer: ProcessObserver;
  private readonly logs: ProcessLogs;
  private readonly workspaceBudget: WorkspaceBudget | undefined;
  private readonly capacity: WorkspaceCapacity;
  private closed = false;
  private pool: WarmPool | undefined;
  private host: HostEnvironment | undefined;

  private constructor(options: SandboxManagerOptions, backends: Backend[]) {
    this.backends = new Map(backends.map((b) => [b.name, b]));
    this.store = options.store ?? new MemoryRecordStore();
    this.maxima = options.maxima ?? DEFAULT_MAXIMA;
    this.now = options.now ?? Date.now;
    this.onEvent = options.onEvent ?? (() => undefined);
    this.filesFactory = options.filesFactory;
    this.observer = options.processObserver ?? {};
    this.logs = options.processLogs ?? new ProcessLogs({ dataDir: options.dataDir });
    this.workspaceBudget = options.workspaceBudget;
    const pooledBytes = (options.warmPool ?? 0) * parseSpec({}, this.maxima).limits.diskBytes;
    this.capacity = new WorkspaceCapacity({
      measure: async () => {
        await this.host!.ensure();
        return this.host!.volume.capacity();
      },
      overcommit: options.diskOvercommit,
      heldBytes: () => (this.pool ? pooledBytes : 0),
    });
    // Once an ended sandbox's logs are gone, so is what the engine remembers of its processes.
    this.logs.onRemoved = (sandboxId) => {
      const entry = this.sandboxes.get(sandboxId);
      if (entry && !LIVE_STATES.has(entry.info.state)) this.sandboxes.delete(sandboxId);
    };
  }

  /** Prepares the host, reconciles it with the store, and recovers sandboxes a crash left. */
  static async open(options: SandboxManagerOptions): Promise<SandboxManager> {
    const host = options.host ?? new HostEnvironment({ dataDir: options.dataDir });
    const backends = options.backends ?? createBackends(host);
    const manager = new SandboxManager(options, backends);
    manager.host = host;
    await manager.reconcile();
    // After reconcile, which removes every sandbox it does not know, warm ones included.
    const namespace = manager.backends.get('namespace');
    if (options.warmPool && namespace) {
      manager.pool = new WarmPool({ backend: namespace, spec: parseSpec({}, manager.maxima), size: options.warmPool });
    }
    return manager;
  }

  private async reconcile(): Promise<void> {
    const live = this.store.listLive();
    const liveIds = new Set(live.map((r) => r.sandboxId));
    for (const backend of this.backends.values()) await backend.reconcile(liveIds);
    for (const record of live) await this.recover(record);
  }

  /** A sandbox that was live when Capsule stopped: its files are kept, its processes are gone. */
  private async recover(record: SandboxInfo): Promise<void> {
    const entry: Live = { info: { ...record }, processes: new Map() };
    this.sandboxes.set(record.sandboxId, entry);
    // Its workspace is there: it counts against the volume and its tenant's quota until it ends.
    const diskBytes = record.spec.limits.diskBytes;
    const releaseVolume = this.capacity.restore(diskBytes);
    this.workspaceBudget?.restoreWorkspace({ tenantId: record.tenantId }, diskBytes);
    entry.releaseDisk = once(() => {
      releaseVolume();
      this.workspaceBudget?.releaseWorkspace({ tenantId: record.tenantId }, diskBytes);
    });
    if (Date.parse(record.expiresAt) <= this.now()) {
      await this.end(entry, 'expired', 'ttl expired while the server was down');
      return;
    }
    const backend = this.backends.get(record.spec.backend);
    try {
      if (!backend) throw new SandboxError('BACKEND_UNAVAILABLE', `backend ${record.spec.backend} is not configured`);
      if (record.state === 'paused' && record.pause?.survivesRestart && backend.restore) {
        // Paused to disk (gVisor checkpoint): it stays paused, with its processes, until resumed.
        const sandbox = await backend.restore(record.sandboxId, record.spec);
        this.attach(entry, sandbox);
        this.save(entry);
        this.schedule(entry);
        this.onEvent({ type: 'sandbox.recovered', sandbox: this.snapshot(entry) });
        return;
      }
      const sandbox = await backend.create(record.spec, { id: record.sandboxId, reuseWorkspace: true });
      this.attach(entry, sandbox);
      entry.info.state = 'running';
      delete entry.info.pause;
      this.save(entry);
      this.schedule(entry);
      this.onEvent({ type: 'sandbox.recovered', sandbox: this.snapshot(entry) });
    } catch (error) {
      await this.end(entry, 'failed', `lost in a server restart: ${(error as Error).message}`);
    }
  }

  async create(command: CreateSandboxCommand): Promise<SandboxInfo> {
    this.assertOpen();
    const spec = parseSpec(command.spec ?? {}, this.maxima);
    const backend = this.backends.get(spec.backend);
    if (!backend) {
      throw new SandboxError('BACKEND_UNAVAILABLE', `backend ${spec.backend} is not configured on this server`, {
        details: { backend: spec.backend },
        hint: `Use one of: ${[...this.backends.keys()].join(', ')}.`,
      });
    }
    assertEnforceable(spec, await backend.probe());
    const releaseDisk = this.reserveDisk(command, spec, await this.capacity.measure());
    let warm: BackendSandbox | undefined;
    try {
      warm = await this.pool?.take(spec);
    } catch (error) {
      releaseDisk();
      throw error;
    }
    const now = this.now();
    const info: SandboxInfo = {
      sandboxId: warm?.id ?? newSandboxId(),
      tenantId: command.tenantId,
      state: 'starting',
      backend: spec.backend,
      spec,
      metadata: { ...(command.metadata ?? {}) },
      createdAt: new Date(now).toISOString(),
      expiresAt: new Date(now + spec.ttlMs).toISOString(),
    };
    const entry: Live = { info, processes: new Map(), quotaBytes: command.diskQuotaBytes, releaseDisk };
    this.sandboxes.set(info.sandboxId, entry);
    this.save(entry);
    try {
      const sandbox = warm ?? (await backend.create(spec, { id: info.sandboxId, signal: command.signal }));
      this.attach(entry, sandbox);
    } catch (error) {
      await this.end(entry, 'failed', `failed to start: ${(error as Error).message}`);
      throw error;
    }
    if (this.closed || entry.info.state !== 'starting') {
      await this.end(entry, 'killed', 'killed while starting');
      throw new SandboxError('SANDBOX_NOT_RUNNING', `sandbox ${info.sandboxId} was stopped while it started`);
    }
    entry.info.state = 'running';
    this.save(entry);
    this.schedule(entry);
    this.onEvent({ type: 'sandbox.created', sandbox: this.snapshot(entry), poolWarm: warm !== undefined });
    return this.snapshot(entry);
  }

  get(tenantId: string, sandboxId: string): SandboxInfo {
    return this.snapshot(this.find(tenantId, sandboxId));
  }

  list(query: ListSandboxesQuery): SandboxInfo[] {
    const wanted = query.states ? new Set(query.states) : undefined;
    return [...this.sandboxes.values()]
      .map((e) => e.info)
      .filter((i) => i.tenantId === query.tenantId)
      .filter((i) => !wanted || wanted.has(i.state))
      .filter((i) => Object.entries(query.metadata ?? {}).every(([k, v]) => i.metadata[k] === v))
      .map((i) => structuredClone(i));
  }

  async kill(tenantId: string, sandboxId: string): Promise<SandboxInfo> {
    const entry = this.find(tenantId, sandboxId);
    if (LIVE_STATES.has(entry.info.state)) await this.end(entry, 'killed', 'killed by request');
    else await entry.ending;
    return this.snapshot(entry);
  }

  setTimeout(tenantId: string, sandboxId: string, ttlMs: number): SandboxInfo {
    const entry = this.findLive(tenantId, sandboxId);
    if (!Number.isInteger(ttlMs) || ttlMs <= 0 || ttlMs > this.maxima.ttlMs) {
      throw new SandboxError('INVALID_ARGUMENT', `ttlMs must be a whole number of milliseconds between 1 and ${this.maxima.ttlMs}`, {
        details: { field: 'ttlMs', value: ttlMs, maximum: this.maxima.ttlMs },
        hint: 'Pass the time to live from now, e.g. 60000 for one minute.',
      });
    }
    entry.info.expiresAt = new Date(this.now() + ttlMs).toISOString();
    this.save(entry);
    this.schedule(entry);
    return this.snapshot(entry);
  }

  /** Extends the TTL by the spec's ttlMs from now. */
  keepAlive(tenantId: string, sandboxId: string): SandboxInfo {
    const entry = this.findLive(tenantId, sandboxId);
    return this.setTimeout(tenantId, sandboxId, Math.min(entry.info.spec.ttlMs, this.maxima.ttlMs));
  }

  /**
   * Replaces the network policy of a running sandbox (file and process policy stay fixed): new
   * connections follow it at once; open ones the new policy would not allow are closed. A sandbox
   * created with `network.mode: none` has no network to change (BACKEND_CANNOT_ENFORCE).
   */
  async setNetworkPolicy(tenantId: string, sandboxId: string, policy: NetworkPolicyInput): Promise<SandboxInfo> {
    const entry = this.findRunning(tenantId, sandboxId);
    const spec = parseSpec({ ...entry.info.spec, network: policy }, this.maxima);
    if (entry.info.spec.network.mode === 'none' || !entry.sandbox?.setNetworkPolicy) {
      throw new SandboxError('BACKEND_CANNOT_ENFORCE', `sandbox ${sandboxId} was created without a network and cannot gain one`, {
        details: { sandboxId, backend: entry.info.backend, mode: spec.network.mode },
        hint: 'Create the sandbox with network.mode "allowlist" (an empty allow list reaches nothing) to change its policy later.',
      });
    }
    await entry.sandbox.setNetworkPolicy(spec.network);
    entry.info.spec.network = spec.network;
    this.save(entry);
    return this.snapshot(entry);
  }

  /**
   * Stops the sandbox's work until resumed. `keepMemory` (default true) keeps processes and their
   * memory: on gVisor a checkpoint on disk that survives a server restart; on the namespace backend
   * a frozen cgroup in RAM that does not. `keepMemory: false` ends the processes and keeps files.
   * The answer's `pause` says which.
   */
  async pause(tenantId: string, sandboxId: string, options: { keepMemory?: boolean } = {}): Promise<SandboxInfo> {
    const entry = this.find(tenantId, sandboxId);
    if (entry.info.state === 'paused') {
      throw new SandboxError('CONFLICT', `sandbox ${sandboxId} is already paused`, { details: { sandboxId }, hint: 'Resume it first.' });
    }
    const live = this.findRunning(tenantId, sandboxId);
    await this.pauseEntry(live, options.keepMemory ?? true);
    return this.snapshot(live);
  }

  private async pauseEntry(entry: Live, keepMemory: boolean): Promise<void> {
    const sandbox = entry.sandbox!;
    let result: { keepsMemory: boolean; survivesRestart: boolean };
    if (sandbox.pause) result = await sandbox.pause({ keepMemory });
    else if (keepMemory) {
      await sandbox.freeze();
      result = { keepsMemory: true, survivesRestart: false };
    } else {
      throw new SandboxError('BACKEND_CANNOT_ENFORCE', `backend ${entry.info.backend} cannot pause without memory`, {
        hint: 'Pause with keepMemory: true.',
      });
    }
    entry.info.state = 'paused';
    entry.info.pause = { ...result, pausedAt: new Date(this.now()).toISOString() };
    // With onTimeout 'pause' the TTL is suspended while paused; with 'kill' it still applies.
    if (entry.info.spec.onTimeout === 'pause') clearTimeout(entry.timer);
    this.save(entry);
  }

  /** Continues a paused sandbox; resuming a running one is a no-op. */
  async resume(tenantId: string, sandboxId: string): Promise<SandboxInfo> {
    const entry = this.findLive(tenantId, sandboxId);
    if (entry.info.state === 'paused') {
      const sandbox = entry.sandbox!;
      if (sandbox.resume) await sandbox.resume();
      else await sandbox.thaw();
      for (const agent of sandbox.processes?.() ?? []) {
        if (!entry.processes.has(agent.pid)) this.adoptProcess(entry, agent);
      }
      entry.info.state = 'running';
      delete entry.info.pause;
      if (entry.info.spec.onTimeout === 'pause') entry.info.expiresAt = new Date(this.now() + entry.info.spec.ttlMs).toISOString();
      this.save(entry);
      this.schedule(entry);
    }
    return this.snapshot(entry);
  }

  /** A process a previous Capsule process started (restored from a checkpoint): events from now on. */
  private adoptProcess(entry: Live, agent: AgentProcess): void {
    const spec = entry.info.spec;
    const owner = { tenantId: entry.info.tenantId, sandboxId: entry.info.sandboxId, quotaBytes: entry.quotaBytes, pid: agent.pid };
    // It runs already: its log takes room as it goes, without a reservation that could refuse it.
    const log = this.logs.open(owner, 0, (high) => agent.throttle?.(high));
    const started = this.now();
    const result = agent.exited.then((exit): ExecResult => ({
      outcome: exit.lost ? 'error' : exit.exitCode === 0 ? 'ok' : 'exit_nonzero',
      exitCode: exit.exitCode,
      signal: exit.signal,
      stdout: '',
      stderr: '',
      stdoutTruncated: false,
      stderrTruncated: false,
      stdoutBytes: 0,
      stderrBytes: 0,
      durationMs: this.now() - started,
      usage: { memoryPeakBytes: 0, cpuTimeMs: 0, cpuThrottledMs: 0, diskUsedBytes: null },
      warnings: [],
      ...(exit.lost ? { error: { code: 'SANDBOX_CRASHED', message: `sandbox ${entry.info.sandboxId} stopped while the process ran` } } : {}),
    }));
    const managed = new ManagedProcess({ argv: ['(restored)'], cwd: spec.cwd, startedAt: new Date(started).toISOString() }, spec.limits, result);
    managed.started(agent, log);
    agent.onStdout((chunk) => managed.output('stdout', chunk));
    agent.onStderr((chunk) => managed.output('stderr', chunk));
    void managed.ended.finally(() => this.logs.closed(owner, log)).catch(() => undefined);
    entry.processes.set(agent.pid, managed);
  }

  async startProcess(tenantId: string, sandboxId: string, command: StartProcessCommand): Promise<ProcessHandle> {
    const entry = this.findRunning(tenantId, sandboxId);
    const sandbox = entry.sandbox!;
    const spec = entry.info.spec;
    if (command.timeoutMs !== undefined && (command.timeoutMs <= 0 || command.timeoutMs > this.maxima.limits.wallClockMs)) {
      throw new SandboxError('INVALID_ARGUMENT', `timeoutMs must be between 1 and ${this.maxima.limits.wallClockMs}`, {
        details: { field: 'timeoutMs', value: command.timeoutMs },
      });
    }
    // Room in the tenant's disk budget for what the process's log keeps, before anything starts.
    const owner: LogOwner = { tenantId, sandboxId, quotaBytes: entry.quotaBytes };
    const reserved = this.logs.reserve(owner, spec.limits);
    let log: ProcessOutput | undefined;
    let resolveStarted: (() => void) | undefined;
    const started = new Promise<void>((resolve) => (resolveStarted = resolve));
    let settle: ((result: Promise<ExecResult>) => void) | undefined;
    const settled = new Promise<ExecResult>((resolve) => (settle = (r) => resolve(r)));
    const managed = new ManagedProcess(
      { argv: [...command.argv], cwd: command.cwd ?? spec.cwd, tag: command.tag, startedAt: new Date(this.now()).toISOString() },
      spec.limits,
      settled,
    );
    const observed = (): ObservedProcess => ({ tenantId, sandboxId, backend: entry.info.backend, pid: managed.pid });
    const result = superviseExec(
      sandbox,
      {
        argv: command.argv,
        env: { ...baseEnv(), ...spec.env, ...(command.env ?? {}) },
        cwd: command.cwd ?? spec.cwd,
        stdin: command.stdin ?? false,
        ...(command.pty ? { pty: command.pty } : {}),
      },
      {
        timeoutMs: command.timeoutMs ?? spec.limits.wallClockMs,
        keepOutput: false,
        onStart: (agent) => {
          log = this.logs.open({ ...owner, pid: agent.pid }, reserved, (high) => agent.throttle?.(high));
          managed.started(agent, log);
          entry.processes.set(agent.pid, managed);
          this.trimEnded(entry);
          this.observer.onProcessStart?.(observed());
          resolveStarted?.();
        },
        onStdout: (chunk) => managed.output('stdout', chunk),
        onStderr: (chunk) => managed.output('stderr', chunk),
        onWarning: (warning) => managed.warn(warning),
      },
    );
    settle?.(result);
    // The log is closed (its unused reservation given back) once the process ended.
    void managed.ended
      .finally(() => (log ? this.logs.closed({ ...owner, pid: managed.pid }, log) : this.logs.unreserve(owner, reserved)))
      .catch(() => undefined);
    // Observer hook: where a process's result settles (also for programs that never started).
    void result.then((r) => this.observer.onExecResult?.(observed(), r), () => undefined);
    const outcome = await Promise.race([started.then(() => undefined), result]);
    if (outcome !== undefined && outcome.error?.code === 'EXEC_FAILED') {
      throw new SandboxError('EXEC_FAILED', outcome.error.message, {
        details: { argv0: command.argv[0] },
        hint: 'Check that the program exists in the sandbox (PATH is /usr/local/bin:/usr/bin:/bin) and the cwd exists.',
      });
    }
    return managed;
  }

  getProcess(tenantId: string, sandboxId: string, pid: number): ProcessHandle {
    const entry = this.find(tenantId, sandboxId);
    const process = entry.processes.get(pid);
    if (!process) {
      throw new SandboxError('PROCESS_NOT_FOUND', `no process ${pid} in sandbox ${sandboxId}`, {
        details: { sandboxId, pid },
        hint: 'List processes to see the pids this sandbox knows.',
      });
    }
    return process;
  }

  listProcesses(tenantId: string, sandboxId: string): ProcessInfo[] {
    const entry = this.find(tenantId, sandboxId);
    return [...entry.processes.values()].map((p) => ({ ...p.info }));
  }

  files(tenantId: string, sandboxId: string): SandboxFiles {
    const entry = this.findRunning(tenantId, sandboxId);
    if (!this.filesFactory) throw new SandboxError('UNIMPLEMENTED', 'this engine has no file service configured');
    entry.files ??= this.filesFactory(entry.sandbox!);
    return entry.files;
  }

  /** The backend sandbox of a running sandbox, for services built on it (interpreter, artifacts). */
  backendSandbox(tenantId: string, sandboxId: string): BackendSandbox {
    return this.findRunning(tenantId, sandboxId).sandbox!;
  }

  /** Interpreter contexts by sandbox id; a service lives as long as its sandbox runs. */
  private readonly interpreters = new Map<string, InterpreterService>();

  /**
   * The interpreter contexts of a running sandbox (src/engine/interpreter), created on first use.
   * Every surface (v1 routes, the E2B facade) shares this one service, so they see the same
   * contexts. It is closed when the sandbox ends.
   */
  interpreter(tenantId: string, sandboxId: string): InterpreterService {
    const entry = this.findRunning(tenantId, sandboxId);
    let service = this.interpreters.get(sandboxId);
    if (!service) this.interpreters.set(sandboxId, (service = new InterpreterService(entry.sandbox!)));
    return service;
  }

  /** Shuts the sandbox's contexts down (alongside its destroy, so a busy kernel cannot delay it). */
  private async closeInterpreter(sandboxId: string): Promise<void> {
    const service = this.interpreters.get(sandboxId);
    this.interpreters.delete(sandboxId);
    await service?.close();
  }

  /** Destroys every live sandbox; records say why. */
  async close(): Promise<void> {
    this.closed = true;
    await this.pool?.close();
    const live = [...this.sandboxes.values()].filter((e) => LIVE_STATES.has(e.info.state));
    await Promise.all(live.map((e) => this.end(e, 'killed', 'server shut down')));
    await Promise.all([...this.sandboxes.values()].flatMap((e) => (e.ending ? [e.ending] : [])));
    for (const backend of this.backends.values()) await backend.close?.();
    await this.host?.volume.releaseIfIdle();
  }

  private attach(entry: Live, sandbox: BackendSandbox): void {
    entry.sandbox = sandbox;
    void sandbox.lost.then(() => {
      if (!LIVE_STATES.has(entry.info.state)) return;
      this.onEvent({ type: 'sandbox.crashed', sandbox: this.snapshot(entry) });
      return this.end(entry, 'failed', 'crashed: the sandbox stopped on its own (its init or agent exited)');
    });
  }

  private schedule(entry: Live): void {
    clearTimeout(entry.timer);
    if (entry.info.state === 'paused' && entry.info.spec.onTimeout === 'pause') return;
    const delay = Math.max(0, Date.parse(entry.info.expiresAt) - this.now());
    // Node timers hold at most ~24.8 days; a longer TTL re-arms when the first one fires.
    entry.timer = setTimeout(() => {
      if (Date.parse(entry.info.expiresAt) > this.now()) return this.schedule(entry);
      if (entry.info.spec.onTimeout === 'pause' && entry.info.state === 'running') {
        void this.pauseEntry(entry, true).catch(() => this.end(entry, 'expired', 'ttl expired; pausing failed'));
        return;
      }
      void this.end(entry, 'expired', 'ttl expired');
    }, Math.min(delay, 2 ** 31 - 1));
    entry.timer.unref();
  }

  /** Moves a sandbox to an ended state once, destroying its host resources. */
  private end(entry: Live, state: 'killed' | 'expired' | 'failed', reason: string): Promise<void> {
    if (entry.ending) return entry.ending;
    clearTimeout(entry.timer);
    entry.info.state = state;
    entry.info.endReason = reason;
    entry.info.endedAt = new Date(this.now()).toISOString();
    entry.ending = (async () => {
      try {
        await Promise.all([entry.sandbox?.destroy(), this.closeInterpreter(entry.info.sandboxId)]);
      } catch (error) {
        entry.info.endReason = `${reason}; cleanup failed: ${(error as Error).message}`;
      }
      entry.releaseDisk?.();
      this.save(entry);
      this.logs.sandboxEnded(entry.info.sandboxId);
      if (state !== 'failed') this.onEvent({ type: `sandbox.${state}`, sandbox: this.snapshot(entry) });
    })();
    this.save(entry);
    return entry.ending;
  }

  /**
   * Promises the workspace's disk limit on the volume (CAPACITY_EXHAUSTED when it cannot be
   * backed) and charges it to the tenant's quota (QUOTA_EXCEEDED), both before anything is made
   * and in one synchronous step, so concurrent creates cannot overshoot. Returns the release.
   */
  private reserveDisk(command: CreateSandboxCommand, spec: SandboxSpec, capacity: VolumeCapacity): () => void {
    const diskBytes = spec.limits.diskBytes;
    const releaseVolume = this.capacity.reserve(diskBytes, capacity);
    const owner = { tenantId: command.tenantId, quotaBytes: command.diskQuotaBytes };
    try {
      this.workspaceBudget?.reserveWorkspace(owner, diskBytes);
    } catch (error) {
      releaseVolume();
      throw error;
    }
    return once(() => {
      releaseVolume();
      this.workspaceBudget?.releaseWorkspace(owner, diskBytes);
    });
  }

  private trimEnded(entry: Live): void {
    if (entry.processes.size <= MAX_ENDED_PROCESSES) return;
    for (const [pid, process] of entry.processes) {
      if (entry.processes.size <= MAX_ENDED_PROCESSES) break;
      if (!process.info.running) entry.processes.delete(pid);
    }
  }

  private save(entry: Live): void {
    this.store.upsert(this.snapshot(entry));
  }

  private snapshot(entry: Live): SandboxInfo {
    return structuredClone(entry.info);
  }

  private find(tenantId: string, sandboxId: string): Live {
    const entry = this.sandboxes.get(sandboxId);
    if (!entry || entry.info.tenantId !== tenantId) {
      throw new SandboxError('SANDBOX_NOT_FOUND', `sandbox ${sandboxId} not found`, {
        details: { sandboxId },
        hint: 'Check the id; sandboxes of other tenants are not visible.',
      });
    }
    return entry;
  }

  private findLive(tenantId: string, sandboxId: string): Live {
    const entry = this.find(tenantId, sandboxId);
    if (!LIVE_STATES.has(entry.info.state)) {
      throw new SandboxError('SANDBOX_NOT_RUNNING', `sandbox ${sandboxId} is ${entry.info.state}${entry.info.endReason ? ` (${entry.info.endReason})` : ''}`, {
        details: { sandboxId, state: entry.info.state },
        hint: 'Create a new sandbox.',
      });
    }
    return entry;
  }

  private findRunning(tenantId: string, sandboxId: string): Live {
    const entry = this.findLive(tenantId, sandboxId);
    if (entry.info.state !== 'running' || !entry.sandbox) {
      throw new SandboxError('SANDBOX_NOT_RUNNING', `sandbox ${sandboxId} is ${entry.info.state}`, {
        details: { sandboxId, state: entry.info.state },
        hint: entry.info.state === 'paused' ? 'Resume the sandbox first.' : 'Wait until it is running.',
      });
    }
    return entry;
  }

  private assertOpen(): void {
    if (this.closed) throw new SandboxError('SANDBOX_NOT_RUNNING', 'the engine is shutting down');
  }
}

/** `fn`, callable many times, run once. */
function once(fn: () => void): () => void {
  let done = false;
  return () => {
    if (done) return;
    done = true;
    fn();
  };
}
