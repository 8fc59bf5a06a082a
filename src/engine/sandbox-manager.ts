import { setMaxListeners } from 'node:events';
import type { Readable } from 'node:stream';
import { join } from 'node:path';
import type { Duplex } from 'node:stream';
import { SandboxError } from '../errors/index.js';
import { DEFAULT_MAXIMA, HOST_TEMPLATE, parseSpec, type BackendName, type NetworkPolicyInput, type OperatorMaxima, type SandboxSpec } from '../sandbox-spec/index.js';
import type { Backend, BackendSandbox } from '../backends/backend.js';
import type { HostMount } from '../host/mount-roots.host.js';
import type { HostEnvironment } from '../host/host-env.host.js';
import { checkMountRoots, type MountRoots } from '../host/mount-roots.host.js';
import { CredentialBroker } from '../host/egress/broker.js';
import { MemoryRecordStore, MemorySnapshotRecords, MemoryVolumeRecords, type SandboxRecordStore, type SnapshotRecordStore, type VolumeRecordStore } from '../store/index.js';
import type { ArtifactStore } from '../store/artifacts/index.js';
import { isLiveState, type ForkResult, type ProcessInfo, type SandboxInfo, type SnapshotInfo, type UsageSample, type VolumeInfo, type ApplyResult, type Changes, type CreateVolumeInput } from '../wire/index.js';
import { collectArtifacts, type Collection } from './artifacts.js';
import { SandboxStepRunner } from './build-step-runner.js';
import type { StepRunner } from '../templates/index.js';
import { warmFirstCommand } from '../templates/rootfs/first-command-cache.host.js';
import { assertEnforceable } from './capabilities.js';
import { openEngineHost, type EngineHostOptions } from './engine-host.js';
import type { EngineEvent, ProcessObserver } from './events.js';
import { newSandboxId } from './ids.js';
import { resolveMounts, type MountGrant } from './mounts.js';
import type { InterpreterService } from './interpreter/index.js';
import { Interpreters } from './interpreters.js';
import { pauseSandbox, resumeSandbox } from './pausing.js';
import { ProcessTable, type ProcessTableOptions } from './process-table.js';
import { SandboxTable, snapshot, type LiveSandbox } from './sandbox-table.js';
import { startTemplate, withTemplate } from './template-start.js';
import { hasTemplateRoot, HostOnlyCatalog, type TemplateCatalog, type TemplateImage } from './templates.js';
import { Snapshots, type TakeSnapshotOptions } from './snapshots.js';
import { forkAll } from './fork.js';
import { adoptRestored, fromSnapshotInput } from './snapshot-create.js';
import { Volumes } from './volumes.js';
import { applyChanges, exportChanges, listChanges, type ChangesContext } from './changes/changes.js';
import { TtlTimers } from './ttl.js';
import { takeBackSandboxes } from './restart.js';
import type { CreateSandboxCommand, EngineCloseOptions, EngineCollectOptions, ForkOptions, ListSandboxesQuery, ProcessHandle, SandboxEngine, SandboxFiles, StartProcessCommand } from './types.js';
import { UsageSampler } from './usage-sampler.js';
import { heldByPools, WarmPool } from './warm-pool.js';
import { ProcessLogs } from './process-logs.js';
import { WorkspaceCapacity, type DiskBudget } from './disk-budget.js';
import { Admission } from './admission.js';
import { admissionOptions, demandOf, type AdmissionSettings } from './admission-settings.js';
import { readHostLimits, type HostLimits } from '../host/host-limits.host.js';
import type { CapacityInfo } from '../wire/index.js';
import { untilAborted } from './until-aborted.js';

export interface SandboxManagerOptions extends EngineHostOptions {
  store?: SandboxRecordStore;
  /** Snapshot records (their data is on the workspace volume). @default in memory */
  snapshotStore?: SnapshotRecordStore;
  /** Volume records (their data is on the workspace volume). @default in memory */
  volumeStore?: VolumeRecordStore;
  maxima?: OperatorMaxima;
  /** Clock for TTLs. @default Date.now */
  now?: () => number;
  onEvent?: (event: EngineEvent) => void;
  /**
   * Namespace sandboxes kept started ahead for creates whose spec can share them (no network, no
   * mounts, default start-time limits); each is used once. A number: that many of the default
   * template; a map: that many per template reference. @default 0
   */
  warmPool?: number | Readonly<Record<string, number>>;
  /** Builds the file service of a live sandbox (src/engine/files). */
  filesFactory?: (sandbox: BackendSandbox) => SandboxFiles;
  /** Observes processes and artifact deliveries (metrics, output logs). Must not throw. */
  processObserver?: ProcessObserver;
  /** Where `collectArtifacts` delivers files. */
  artifacts?: ArtifactStore;
  /** Per-sandbox usage sampling. @default a sampler every 5 s, 120 samples kept */
  usage?: UsageSampler;
  /** Where templates come from (spec.template). @default the host template only */
  templates?: TemplateCatalog;
  /**
   * The operator's grants of credential handles to tenants. @default the broker's configuration
   * in `<dataDir>/broker` (the same the egress network serves)
   */
  handleGrants?: HandleGrants;
  /**
   * The operator's mount roots, checked (`SandboxManager.checkMountRoots`): the only host
   * directories a spec can mount, each by name and only by a caller granted it. @default none
   */
  mountRoots?: MountRoots;
  /**
   * Where processes' output is logged and replayed from (`<dataDir>/logs`), and whose disk budget
   * it takes. @default logs under `dataDir`, kept until removed, with no budget
   */
  processLogs?: ProcessLogs;
  /**
   * Where tenants' workspaces, snapshots and volumes are charged (their disk quota).
   * @default nothing is charged
   */
  workspaceBudget?: DiskBudget;
  /**
   * How far the disk limits of live sandboxes may exceed what the workspace volume can back
   * (1: never; a create that does not fit is refused with CAPACITY_EXHAUSTED). @default 1
   */
  diskOvercommit?: number;
  /** Admission control: sandbox slots, host memory and pids (admission-settings.ts). */
  admission?: AdmissionSettings;
}

/** Which credential handles a tenant may name (the broker's `handles.json`, `tenants` field). */
export interface HandleGrants {
  /** The names among `handles` the tenant may not use (unknown or not granted, alike). */
  ungranted(tenantId: string, handles: readonly string[]): Promise<string[]>;
}

/**
 * Durable sandboxes: lifecycle (create → running → killed/expired/failed), TTLs, pause, the
 * processes and interpreter contexts of each, and recovery after a crash. Thin callers (HTTP
 * routes, the E2B facade, MCP) turn requests into calls here; the pieces live beside it
 * (sandbox-table, ttl, pausing, process-table, interpreters, restart).
 *
 * Over 800 lines (811): it is the SandboxEngine's one implementation, and most of its methods
 * are a tenant check and a delegation. The next piece to move out is the lifecycle of a live
 * entry (attach, markRunning, pause, expire, end) into its own file, as restart.ts was.
 */
export class SandboxManager implements SandboxEngine {
  private readonly table: SandboxTable;
  private readonly backends: Map<BackendName, Backend>;
  readonly maxima: OperatorMaxima;
  private readonly now: () => number;
  private readonly onEvent: (event: EngineEvent) => void;
  private readonly observer: ProcessObserver;
  private readonly ttl: TtlTimers;
  private readonly templates: TemplateCatalog;
  private readonly grants: HandleGrants;
  private readonly interpreters = new Interpreters();
  private readonly usageSampler: UsageSampler;
  private readonly logs: ProcessLogs;
  private readonly workspaceBudget: DiskBudget | undefined;
  private readonly capacity: WorkspaceCapacity;
  private readonly admission: Admission;
  private closed = false;
  /** Let go at close (keepSandboxes): still running under their supervisors, not ours to end. */
  private readonly leftRunning = new Set<string>();
  /** Ended sandboxes being written out of memory (`retire`); close waits for them. */
  private readonly retiring = new Set<Promise<void>>();
  /** Aborts when close() starts: a retire still waiting for its processes gives up then. */
  private readonly closing = new AbortController();
  private readonly pools = new Map<string, WarmPool>();
  private readonly snapshotsOf: Snapshots | undefined;
  private readonly volumesOf: Volumes | undefined;

  private constructor(
    private readonly options: SandboxManagerOptions,
    backends: Backend[],
    private readonly host: HostEnvironment | undefined,
    private readonly mountRoots: MountRoots,
    hostLimits: HostLimits,
  ) {
    this.backends = new Map(backends.map((b) => [b.name, b]));
    // One listener per retire still waiting for its records, each removed when they come: many at
    // once under churn is expected, not a leak (Node warns past 10).
    setMaxListeners(0, this.closing.signal);
    this.table = new SandboxTable(options.store ?? new MemoryRecordStore(), {
      kept: (sandboxId) => this.logs.keepsEnded(sandboxId),
      read: (sandboxId) => ProcessTable.ofEnded(this.processTableOptions(), sandboxId, this.logs.readEnded(sandboxId) ?? []),
    });
    this.maxima = options.maxima ?? DEFAULT_MAXIMA;
    this.now = options.now ?? Date.now;
    this.onEvent = options.onEvent ?? (() => undefined);
    this.observer = options.processObserver ?? {};
    this.usageSampler = options.usage ?? new UsageSampler({ now: this.now });
    this.ttl = new TtlTimers(this.now, (entry) => this.expire(entry));
    this.templates = options.templates ?? new HostOnlyCatalog();
    this.grants = options.handleGrants ?? new CredentialBroker({ dir: join(options.dataDir, 'broker') });
    this.logs = options.processLogs ?? new ProcessLogs({ dataDir: options.dataDir });
    this.workspaceBudget = options.workspaceBudget;
    // Warm sandboxes hold their disk limits on the volume while they wait.
    const pooledBytes = (): number => [...this.pools.values()].reduce((sum, pool) => sum + pool.heldDiskBytes, 0);
    this.capacity = new WorkspaceCapacity({
      measure: async () => {
        await this.host!.ensure();
        return this.host!.volume.capacity();
      },
      overcommit: options.diskOvercommit,
      heldBytes: () => pooledBytes(),
    });
    this.admission = new Admission(admissionOptions(options.admission, hostLimits, this.capacity, () => heldByPools(this.pools.values())));
    // Once an ended sandbox's logs are gone, so is what the engine remembers of its processes.
    this.logs.onRemoved = (sandboxId) => this.table.retire(sandboxId);
    this.snapshotsOf = host ? new Snapshots(host.volume, options.snapshotStore ?? new MemorySnapshotRecords(), this.now, this.workspaceBudget) : undefined;
    this.volumesOf = this.snapshotsOf ? new Volumes(this.snapshotsOf.disks, options.volumeStore ?? new MemoryVolumeRecords(), this.now, this.workspaceBudget) : undefined;
  }

  /**
   * Validates the operator's roots (`serve --mount-root NAME=PATH`) before anything else starts:
   * each an existing directory, no kernel filesystem, apart from `privateDirs` (the data and
   * database directories). INVALID_ARGUMENT names a bad root.
   */
  static checkMountRoots(roots: Readonly<Record<string, string>>, privateDirs: readonly string[]): Promise<MountRoots> {
    return checkMountRoots(roots, privateDirs);
  }

  /** The names of the operator's mount roots (what an API key can be granted). */
  get mountRootNames(): string[] {
    return [...this.mountRoots.keys()];
  }

  /** Prepares the host, reconciles it with the store, and recovers sandboxes a crash left. */
  static async open(options: SandboxManagerOptions): Promise<SandboxManager> {
    const { host, backends, broker } = openEngineHost(options);
    const manager = new SandboxManager({ ...options, handleGrants: options.handleGrants ?? broker }, backends, host, options.mountRoots ?? new Map(), await readHostLimits());
    await manager.reconcile();
    // After reconcile, which removes every sandbox it does not know, warm ones included.
    await manager.startPools(options.warmPool);
    return manager;
  }

  async create(command: CreateSandboxCommand): Promise<SandboxInfo> {
    this.assertOpen();
    // A snapshot being made from is held: its delete is refused until the sandbox is in the
    // table (a dependent from then on) or its create failed.
    const from = command.spec?.snapshot !== undefined ? this.snapshots.hold(command.tenantId, command.spec.snapshot) : undefined;
    try {
      return await this.createFrom(command, from?.info);
    } finally {
      from?.release();
    }
  }

  private async createFrom(command: CreateSandboxCommand, from: SnapshotInfo | undefined): Promise<SandboxInfo> {
    const input = from ? fromSnapshotInput(command.spec ?? {}, from) : (command.spec ?? {});
    const full = from?.mode === 'full' ? await this.snapshots.full(from) : undefined;
    const image = from ? this.snapshotImage(from) : await this.templates.resolve(command.tenantId, input.template ?? this.templates.defaultRef);
    // Found before anything is made: a snapshot whose data is gone is refused with no record left.
    const workspaceFrom = from?.disk === 'workspace' ? { workspaceFrom: this.snapshots.diskOf(from) } : {};
    const spec = parseSpec(withTemplate(input, image), this.maxima);
    const backend = this.backend(spec.backend);
    assertEnforceable(spec, await backend.probe());
    await this.assertGranted(command.tenantId, spec.network.handles);
    // Before anything is made: a refused mount leaves no record and no host resource.
    const mounts = await this.mountsFor(spec, command.grants?.mountRoots ?? []);
    const admitted = await this.admission.admit(demandOf(command.tenantId, spec), { waitMs: command.waitForCapacityMs, signal: command.signal });
    let releaseDisk: () => void;
    try {
      this.assertOpen();
      releaseDisk = this.chargeTenantDisk(command, spec, admitted.releaseVolume);
    } catch (error) {
      admitted.cancel();
      throw error;
    }
    let warm: BackendSandbox | undefined;
    let volumes: ReturnType<Volumes['resolve']>;
    try {
      warm = from ? undefined : await this.pools.get(poolName(image))?.take(spec);
      // Resolved and recorded with no await between: two creates cannot both take a volume's writer slot.
      volumes = spec.volumes.length > 0 ? this.volumes.resolve(command.tenantId, spec, this.liveInfos()) : [];
    } catch (error) {
      releaseDisk();
      admitted.cancel();
      await warm?.destroy();
      throw error;
    }
    const now = this.now();
    const entry = this.newEntry({
      sandboxId: warm?.id ?? newSandboxId(),
      tenantId: command.tenantId,
      state: 'starting',
      backend: spec.backend,
      spec,
      metadata: { ...(command.metadata ?? {}) },
      createdAt: new Date(now).toISOString(),
      expiresAt: new Date(now + spec.ttlMs).toISOString(),
      ...(from ? { origin: { snapshotId: from.snapshotId } } : {}),
    });
    admitted.settle(entry.info.sandboxId);
    entry.quotaBytes = command.grants?.diskQuotaBytes;
    entry.releaseDisk = releaseDisk;
    this.table.save(entry);
    try {
      const template = image.layerDir !== undefined ? { layerDir: image.layerDir } : undefined;
      // A template's next sandbox finds its root ready (a snapshot's is kept when it is taken).
      if (template && !from) this.host?.volume.keepLayerSpare(template.layerDir, warmFirstCommand);
      const restoreFrom = full ? { restoreFrom: full.checkpointDir } : {};
      const create = { id: entry.info.sandboxId, signal: command.signal, mounts, volumes, tenantId: command.tenantId, ...(template ? { template } : {}), ...workspaceFrom, ...restoreFrom };
      this.attach(entry, warm ?? (await backend.create(spec, create)));
      if (full) adoptRestored(entry as LiveSandbox & { sandbox: BackendSandbox }, full, this.interpreters);
      await startTemplate(entry, image, command.signal);
    } catch (error) {
      await this.end(entry, 'failed', `failed to start: ${(error as Error).message}`);
      throw error;
    }
    if (this.closed || entry.info.state !== 'starting') {
      await this.end(entry, 'killed', 'killed while starting');
      throw new SandboxError('SANDBOX_NOT_RUNNING', `sandbox ${entry.info.sandboxId} was stopped while it started`);
    }
    this.markRunning(entry, Date.parse(entry.info.createdAt));
    this.onEvent({ type: 'sandbox.created', sandbox: snapshot(entry), poolWarm: warm !== undefined });
    return snapshot(entry);
  }

  // ---- snapshots and forks

  /** A snapshot of a running or paused sandbox (root and workspace at one instant). */
  async snapshot(tenantId: string, sandboxId: string, options: TakeSnapshotOptions = {}): Promise<SnapshotInfo> {
    this.assertOpen();
    const entry = this.table.findLive(tenantId, sandboxId);
    if (!entry.sandbox || entry.info.state === 'starting') {
      throw new SandboxError('SANDBOX_NOT_RUNNING', `sandbox ${sandboxId} is ${entry.info.state}`, { details: { sandboxId }, hint: 'Wait until it is running.' });
    }
    // A mounted volume cannot be deleted (CONFLICT), so each has its record.
    const mounted = entry.info.spec.volumes.map((m) => ({ name: m.name, path: m.path, readOnly: m.readOnly, volume: this.volumes.find(tenantId, m.name) }));
    return this.snapshots.take(entry as LiveSandbox & { sandbox: BackendSandbox }, options, () => this.interpreters.snapshot(sandboxId), mounted);
  }

  getSnapshot(tenantId: string, snapshotId: string): SnapshotInfo {
    return this.snapshots.find(tenantId, snapshotId);
  }

  listSnapshots(tenantId: string): SnapshotInfo[] {
    return this.snapshots.list(tenantId);
  }

  /** Deletes a snapshot and its data; refused (CONFLICT) while a live sandbox was made from it. */
  async deleteSnapshot(tenantId: string, snapshotId: string): Promise<void> {
    const dependents = this.table
      .all()
      .filter((e) => isLiveState(e.info.state) && e.info.origin?.snapshotId === snapshotId)
      .map((e) => e.info.sandboxId);
    await this.snapshots.delete(tenantId, snapshotId, dependents);
  }

  /**
   * N sandboxes from one snapshot of the source, taken once: each fork is reported on its own
   * (its sandbox or its error); the source runs on, unharmed.
   */
  async fork(tenantId: string, sandboxId: string, options: ForkOptions): Promise<ForkResult> {
    // Every slot first: a fork that would overshoot the tenant's quota or the server's count makes nothing.
    this.admission.assertSlots(tenantId, options.count);
    // Its creates run at once and share the snapshots' commits: a ready clone would only compete.
    const taken = await this.snapshot(tenantId, sandboxId, { name: `fork of ${sandboxId}`, readyClone: false, ...(options.mode ? { mode: options.mode } : {}) });
    const forks = await forkAll(options.count, (index) =>
      this.create({
        tenantId,
        spec: { snapshot: taken.snapshotId },
        metadata: { ...(options.metadata ?? {}), forkOf: sandboxId, forkIndex: String(index) },
        ...(options.signal ? { signal: options.signal } : {}),
        ...(options.grants ? { grants: options.grants } : {}),
      }),
    );
    return { snapshot: taken, forks };
  }

  // ---- changes

  /** Added, modified and deleted paths against where the sandbox came from (or `since`). */
  async changes(tenantId: string, sandboxId: string, options: { since?: string } = {}): Promise<Changes> {
    return listChanges(this.changesContext(), this.findStill(tenantId, sandboxId), options.since);
  }

  /** The added and modified entries as a tar stream. */
  async exportChanges(tenantId: string, sandboxId: string, options: { since?: string } = {}): Promise<Readable> {
    return exportChanges(this.changesContext(), this.findStill(tenantId, sandboxId), options.since);
  }

  /** Applies a fork's changes to this sandbox, its parent; CONFLICT with the paths both changed. */
  async applyChanges(tenantId: string, sandboxId: string, options: { from: string }): Promise<ApplyResult> {
    const parent = this.table.findRunning(tenantId, sandboxId);
    const fork = this.findStill(tenantId, options.from);
    const files = this.files(tenantId, sandboxId);
    const run = async (argv: string[]) => {
      const handle = await parent.processes.start(parent.info, parent.sandbox, { argv, tag: 'apply', ...(hasTemplateRoot(parent.info.spec.template) ? { user: 'root' } : {}) });
      const result = await handle.result;
      if (result.exitCode !== 0) {
        throw new SandboxError('EXEC_FAILED', `applying changes: ${argv.join(' ')} failed: ${result.stderr.trim().slice(-300) || `exit ${result.exitCode}`}`, {
          details: { argv },
          hint: 'The parent sandbox refused a change (permissions, a full disk); fix it there and apply again.',
        });
      }
    };
    return applyChanges(this.changesContext(), parent, fork, { files, run });
  }

  /** A sandbox whose disk can be read: running or paused, with its backend sandbox. */
  private findStill(tenantId: string, sandboxId: string): LiveSandbox & { sandbox: BackendSandbox } {
    const entry = this.table.findLive(tenantId, sandboxId);
    if (!entry.sandbox || entry.info.state === 'starting') {
      throw new SandboxError('SANDBOX_NOT_RUNNING', `sandbox ${sandboxId} is ${entry.info.state}`, { details: { sandboxId }, hint: 'Wait until it is running.' });
    }
    return entry as LiveSandbox & { sandbox: BackendSandbox };
  }

  private changesContext(): ChangesContext {
    if (!this.host) throw new SandboxError('UNIMPLEMENTED', 'this engine has no host volume for changes');
    return { snapshots: this.snapshots, volume: this.host.volume, templates: this.templates };
  }

  // ---- volumes

  async createVolume(tenantId: string, input: CreateVolumeInput, owner: { quotaBytes?: number } = {}): Promise<VolumeInfo> {
    this.assertOpen();
    if (!input.from) return this.volumes.create(tenantId, input, owner);
    // Held while the copy is made: a delete of the snapshot meanwhile is a CONFLICT.
    const held = this.snapshots.hold(tenantId, input.from.snapshotId);
    try {
      const copy = this.snapshots.volumeCopy(held.info, input.from.volume);
      return await this.volumes.create(tenantId, input, owner, { snapshotId: held.info.snapshotId, ...copy });
    } finally {
      held.release();
    }
  }

  getVolume(tenantId: string, key: string, by: 'name' | 'id' = 'name'): Promise<VolumeInfo> {
    return this.volumes.describe(tenantId, key, by);
  }

  listVolumes(tenantId: string): Promise<VolumeInfo[]> {
    return this.volumes.list(tenantId);
  }

  /** Deletes a volume and its data; CONFLICT while a live sandbox mounts it. */
  deleteVolume(tenantId: string, key: string, by: 'name' | 'id' = 'name'): Promise<void> {
    return this.volumes.delete(tenantId, key, this.liveInfos(), by);
  }

  private liveInfos(): SandboxInfo[] {
    return this.table
      .all()
      .map((e) => e.info)
      .filter((i) => isLiveState(i.state));
  }

  private get volumes(): Volumes {
    if (!this.volumesOf) throw new SandboxError('UNIMPLEMENTED', 'this engine has no host volume for volumes');
    return this.volumesOf;
  }

  get(tenantId: string, sandboxId: string): SandboxInfo {
    return snapshot(this.table.find(tenantId, sandboxId));
  }

  /** What the server can still admit (GET /v1/capacity), with `tenantId`'s own quota. */
  capacityOf(tenantId: string): Promise<CapacityInfo> {
    return this.admission.describe(tenantId);
  }

  list(query: ListSandboxesQuery): SandboxInfo[] {
    const wanted = query.states ? new Set(query.states) : undefined;
    return this.table
      .all()
      .map((e) => e.info)
      .filter((i) => i.tenantId === query.tenantId)
      .filter((i) => !wanted || wanted.has(i.state))
      .filter((i) => Object.entries(query.metadata ?? {}).every(([k, v]) => i.metadata[k] === v))
      .map((i) => structuredClone(i));
  }

  async kill(tenantId: string, sandboxId: string): Promise<SandboxInfo> {
    const entry = this.table.find(tenantId, sandboxId);
    if (isLiveState(entry.info.state)) await this.end(entry, 'killed', 'killed by request');
    else await entry.ending;
    return snapshot(entry);
  }

  setTimeout(tenantId: string, sandboxId: string, ttlMs: number): SandboxInfo {
    const entry = this.table.findLive(tenantId, sandboxId);
    if (!Number.isInteger(ttlMs) || ttlMs <= 0 || ttlMs > this.maxima.ttlMs) {
      throw new SandboxError('INVALID_ARGUMENT', `ttlMs must be a whole number of milliseconds between 1 and ${this.maxima.ttlMs}`, {
        details: { field: 'ttlMs', value: ttlMs, maximum: this.maxima.ttlMs },
        hint: 'Pass the time to live from now, e.g. 60000 for one minute.',
      });
    }
    entry.info.expiresAt = new Date(this.now() + ttlMs).toISOString();
    this.table.save(entry);
    this.ttl.schedule(entry);
    return snapshot(entry);
  }

  /** Extends the TTL by the spec's ttlMs from now. */
  keepAlive(tenantId: string, sandboxId: string): SandboxInfo {
    const entry = this.table.findLive(tenantId, sandboxId);
    return this.setTimeout(tenantId, sandboxId, Math.min(entry.info.spec.ttlMs, this.maxima.ttlMs));
  }

  /**
   * Replaces the network policy of a running sandbox (file and process policy stay fixed): new
   * connections follow it at once; open ones the new policy would not allow are closed. A sandbox
   * created with `network.mode: none` has no network to change (BACKEND_CANNOT_ENFORCE).
   */
  async setNetworkPolicy(tenantId: string, sandboxId: string, policy: NetworkPolicyInput): Promise<SandboxInfo> {
    const entry = this.table.findRunning(tenantId, sandboxId);
    const spec = parseSpec({ ...entry.info.spec, network: policy }, this.maxima);
    await this.assertGranted(tenantId, spec.network.handles);
    if (entry.info.spec.network.mode === 'none' || !entry.sandbox.setNetworkPolicy) {
      throw new SandboxError('BACKEND_CANNOT_ENFORCE', `sandbox ${sandboxId} was created without a network and cannot gain one`, {
        details: { sandboxId, backend: entry.info.backend, mode: spec.network.mode },
        hint: 'Create the sandbox with network.mode "allowlist" (an empty allow list reaches nothing) to change its policy later.',
      });
    }
    // Recorded first, then applied: a server that restarts registers the recorded policy, so a
    // tightening acknowledged here is never undone by a crash.
    const previous = entry.info.spec.network;
    entry.info.spec.network = spec.network;
    this.table.save(entry);
    try {
      await entry.sandbox.setNetworkPolicy(spec.network);
    } catch (error) {
      entry.info.spec.network = previous;
      this.table.save(entry);
      throw error;
    }
    return snapshot(entry);
  }

  /**
   * Stops the sandbox's work until resumed. `keepMemory` (default true) keeps processes and their
   * memory; `keepMemory: false` ends the processes and keeps files. The answer's `pause` says which.
   */
  async pause(tenantId: string, sandboxId: string, options: { keepMemory?: boolean } = {}): Promise<SandboxInfo> {
    const entry = this.table.find(tenantId, sandboxId);
    if (entry.info.state === 'paused') {
      throw new SandboxError('CONFLICT', `sandbox ${sandboxId} is already paused`, { details: { sandboxId }, hint: 'Resume it first.' });
    }
    const running = this.table.findRunning(tenantId, sandboxId);
    await this.pauseEntry(running, options.keepMemory ?? true);
    return snapshot(running);
  }

  /** Continues a paused sandbox; resuming a running one is a no-op. Concurrent resumes share one. */
  async resume(tenantId: string, sandboxId: string): Promise<SandboxInfo> {
    const entry = this.table.findLive(tenantId, sandboxId);
    if (entry.info.state === 'paused' && entry.sandbox) {
      entry.resuming ??= (async () => {
        await resumeSandbox(entry as LiveSandbox & { sandbox: BackendSandbox }, this.now());
        this.table.save(entry);
        this.ttl.schedule(entry);
      })().finally(() => (entry.resuming = undefined));
    }
    await entry.resuming;
    return snapshot(entry);
  }

  /**
   * Before a call that acts inside the sandbox: a paused sandbox created with `autoResume` is
   * resumed; any other (unknown, foreign, running, paused without it) is left for the call to judge.
   */
  async wake(tenantId: string, sandboxId: string): Promise<void> {
    const entry = this.table.get(sandboxId);
    if (entry?.info.tenantId !== tenantId || entry.info.state !== 'paused' || !entry.info.spec.autoResume) return;
    await this.resume(tenantId, sandboxId);
  }

  async startProcess(tenantId: string, sandboxId: string, command: StartProcessCommand): Promise<ProcessHandle> {
    const entry = this.table.findRunning(tenantId, sandboxId);
    return entry.processes.start(entry.info, entry.sandbox, command, entry.quotaBytes);
  }

  getProcess(tenantId: string, sandboxId: string, pid: number): ProcessHandle {
    return this.table.find(tenantId, sandboxId).processes.get(sandboxId, pid);
  }

  listProcesses(tenantId: string, sandboxId: string): ProcessInfo[] {
    return this.table.find(tenantId, sandboxId).processes.list();
  }

  files(tenantId: string, sandboxId: string): SandboxFiles {
    const entry = this.table.findRunning(tenantId, sandboxId);
    if (!this.options.filesFactory) throw new SandboxError('UNIMPLEMENTED', 'this engine has no file service configured');
    entry.files ??= this.options.filesFactory(entry.sandbox);
    return entry.files;
  }

  connectPort(tenantId: string, sandboxId: string, port: number, options: { signal?: AbortSignal } = {}): Promise<Duplex> {
    return this.table.findRunning(tenantId, sandboxId).sandbox.connectPort(port, options);
  }

  interpreter(tenantId: string, sandboxId: string): InterpreterService {
    return this.interpreters.of(this.table.findRunning(tenantId, sandboxId).sandbox);
  }

  /** Kept samples, oldest first, plus one taken now while the sandbox runs. */
  async usage(tenantId: string, sandboxId: string): Promise<UsageSample[]> {
    const entry = this.table.find(tenantId, sandboxId);
    return this.usageSampler.samples(sandboxId, entry.info.state === 'running' ? entry.sandbox : undefined);
  }

  async collectArtifacts(tenantId: string, sandboxId: string, options: EngineCollectOptions): Promise<Collection> {
    const entry = this.table.findRunning(tenantId, sandboxId);
    if (!this.options.artifacts) throw new SandboxError('UNIMPLEMENTED', 'this engine has no artifact store configured');
    return collectArtifacts(entry.sandbox, this.options.artifacts, {
      ...options,
      tenantId,
      onOutcome: (outcome) => this.observer.onArtifact?.(outcome),
    });
  }

  /**
   * A runner of Dockerfile RUN steps on this engine's host and backends (a template service's
   * StepRunner): each step a sandbox from its parent layer under the operator's maxima.
   */
  buildStepRunner(): StepRunner {
    if (!this.host) throw new SandboxError('UNIMPLEMENTED', 'this engine runs on given backends with no host: it cannot run build steps');
    return new SandboxStepRunner({ host: this.host, backends: [...this.backends.values()], maxima: this.maxima });
  }

  /** Destroys every live sandbox; records say why. */
  async close(options: EngineCloseOptions = {}): Promise<void> {
    this.closed = true;
    this.closing.abort();
    this.admission.close();
    await Promise.all([...this.pools.values()].map((pool) => pool.close()));
    const left: string[] = [];
    if (options.keepSandboxes === true) {
      for (const entry of this.table.all()) {
        // Paused so that it survives a restart: a gVisor checkpoint on disk (nothing runs, the
        // next start restores it), or a namespace sandbox its supervisor holds (let go of here,
        // the next start reattaches it still paused).
        const pausedToKeep = entry.info.state === 'paused' && entry.info.pause?.survivesRestart === true;
        if (entry.ending) continue;
        if (pausedToKeep) entry.sandbox?.detach?.();
        else if (entry.info.state !== 'running' || !entry.sandbox?.detach?.()) continue;
        // The record stays running; the next start reattaches to its supervisor.
        this.ttl.clear(entry);
        this.usageSampler.untrack(entry.info.sandboxId);
        this.leftRunning.add(entry.info.sandboxId);
        left.push(entry.info.sandboxId);
      }
      options.onLeftRunning?.(left);
    }
    const live = this.table.all().filter((e) => isLiveState(e.info.state) && !this.leftRunning.has(e.info.sandboxId));
    await Promise.all(live.map((e) => this.end(e, 'killed', 'server shut down')));
    await Promise.all(this.table.all().flatMap((e) => (e.ending ? [e.ending] : [])));
    await Promise.all([...this.retiring]);
    this.usageSampler.close();
    for (const backend of this.backends.values()) await backend.close?.();
    await this.host?.volume.spares.clear();
    await this.host?.volume.releaseIfIdle();
  }

  /**
   * Refuses credential handles the operator did not grant to the tenant (PERMISSION_DENIED, the
   * same for an unknown handle, so that one tenant cannot learn another's handle names).
   */
  private async assertGranted(tenantId: string, handles: readonly string[]): Promise<void> {
    if (handles.length === 0) return;
    const ungranted = await this.grants.ungranted(tenantId, handles);
    if (ungranted.length === 0) return;
    const names = ungranted.map((h) => `"${h}"`).join(', ');
    throw new SandboxError('PERMISSION_DENIED', `credential handle${ungranted.length === 1 ? '' : 's'} ${names} ${ungranted.length === 1 ? 'is' : 'are'} not granted to tenant "${tenantId}"`, {
      details: { field: 'network.handles', handles: ungranted, tenantId },
      hint: `Remove ${names} from network.handles, or ask the operator to grant ${ungranted.length === 1 ? 'it' : 'them'} to this tenant ("tenants": ["${tenantId}"] in <dataDir>/broker/handles.json).`,
    });
  }

  /** The operator's warm pools: per template (its public one), of the namespace backend. */
  private async startPools(sizes: SandboxManagerOptions['warmPool']): Promise<void> {
    const namespace = this.backends.get('namespace');
    if (!namespace || sizes === undefined) return;
    const wanted = typeof sizes === 'number' ? { [this.templates.defaultRef]: sizes } : sizes;
    for (const [ref, size] of Object.entries(wanted)) {
      if (size <= 0) continue;
      const image = await this.templates.resolve('default', ref);
      const spec = parseSpec(withTemplate({}, image), this.maxima);
      const template = image.layerDir !== undefined ? { template: { layerDir: image.layerDir } } : {};
      if (image.layerDir !== undefined) this.host?.volume.keepLayerSpare(image.layerDir, warmFirstCommand);
      this.pools.set(poolName(image), new WarmPool({ backend: namespace, spec, size, ...template }));
    }
  }

  // ---- lifecycle

  private async reconcile(): Promise<void> {
    await takeBackSandboxes({
      ...(this.options.store ? { store: this.options.store } : {}),
      backends: this.backends,
      maxima: this.maxima,
      now: this.now,
      onEvent: this.onEvent,
      backend: (name) => this.backend(name),
      mountsFor: (spec, grant) => this.mountsFor(spec, grant),
      volumesOf: (record) => (record.spec.volumes.length > 0 ? this.volumes.resolve(record.tenantId, record.spec, []) : []),
      restoreEntry: (record) => {
        const entry = this.newEntry({ ...record });
        this.chargeRestored(entry);
        return entry;
      },
      attach: (entry, sandbox) => this.attach(entry, sandbox),
      adoptProcesses: (entry, sandbox) => {
        const drivers = this.interpreters.adopt(sandbox, sandbox.processes?.() ?? []);
        for (const agent of sandbox.processes?.() ?? []) if (!drivers.has(agent)) entry.processes.adopt(entry.info, agent);
      },
      markRunning: (entry, sinceMs) => this.markRunning(entry, sinceMs),
      keepPaused: (entry) => {
        this.table.save(entry);
        this.ttl.schedule(entry);
      },
      end: (entry, state, reason) => this.end(entry, state, reason),
    });
    await this.snapshotsOf?.reconcile();
    await this.volumesOf?.reconcile(this.liveInfos());
  }

  /** A sandbox kept over a restart: its disk counts against the volume and its tenant's quota until it ends. */
  private chargeRestored(entry: LiveSandbox): void {
    const { tenantId, spec } = entry.info;
    const diskBytes = spec.limits.diskBytes;
    const releaseVolume = this.capacity.restore(diskBytes);
    this.workspaceBudget?.restoreWorkspace({ tenantId }, diskBytes);
    entry.releaseDisk = once(() => {
      releaseVolume();
      this.workspaceBudget?.releaseWorkspace({ tenantId }, diskBytes);
    });
  }

  private get snapshots(): Snapshots {
    if (!this.snapshotsOf) throw new SandboxError('UNIMPLEMENTED', 'this engine has no host volume for snapshots');
    return this.snapshotsOf;
  }

  /** A snapshot as the image a sandbox is made from: its disk, with no start command to run again. */
  private snapshotImage(from: SnapshotInfo): TemplateImage {
    return { ref: from.template, env: {}, ...(from.disk === 'root' ? { layerDir: this.snapshots.diskOf(from) } : {}) };
  }

  /** The spec's host mounts resolved against the operator's roots, for a caller with `grant`. */
  private mountsFor(spec: SandboxSpec, grant: MountGrant): Promise<HostMount[]> {
    return resolveMounts(spec, grant, this.mountRoots, this.host?.dataDir ?? this.options.dataDir);
  }

  private newEntry(info: SandboxInfo): LiveSandbox {
    const entry: LiveSandbox = {
      info,
      processes: new ProcessTable(this.processTableOptions()),
    };
    this.table.add(entry);
    // Created, recovered or reattached: a live sandbox counts against the host's capacity until it ends.
    if (isLiveState(info.state)) this.admission.hold(info.sandboxId, demandOf(info.tenantId, info.spec));
    return entry;
  }

  private processTableOptions(): ProcessTableOptions {
    return { observer: this.observer, now: this.now, maxWallClockMs: this.maxima.limits.wallClockMs, logs: this.logs };
  }

  /**
   * An ended sandbox leaves memory once its processes' records are beside their logs: the table
   * reads it back on a lookup while its logs are kept (a server that churns through sandboxes
   * holds only the live ones). Kept in memory when the records cannot be written.
   */
  private async retire(entry: LiveSandbox): Promise<void> {
    // A process whose end is never reported (a paused gVisor sandbox's handed-over one) must not
    // hold close(); at close nothing is worth writing: the next start removes ended sandboxes' logs.
    const records = await untilAborted(entry.processes.endedRecords(), this.closing.signal);
    if (this.closed) return;
    const owner = { tenantId: entry.info.tenantId, sandboxId: entry.info.sandboxId, quotaBytes: entry.quotaBytes };
    if (records && (await this.logs.writeEnded(owner, records))) this.table.retire(entry.info.sandboxId);
  }

  private backend(name: BackendName): Backend {
    const backend = this.backends.get(name);
    if (!backend) {
      throw new SandboxError('BACKEND_UNAVAILABLE', `backend ${name} is not configured on this server`, {
        details: { backend: name },
        hint: `Use one of: ${[...this.backends.keys()].join(', ')}.`,
      });
    }
    return backend;
  }

  private attach(entry: LiveSandbox, sandbox: BackendSandbox): void {
    entry.sandbox = sandbox;
    void sandbox.lost.then(async () => {
      if (!isLiveState(entry.info.state) || this.leftRunning.has(entry.info.sandboxId)) return;
      this.onEvent({ type: 'sandbox.crashed', sandbox: snapshot(entry) });
      // Before the end's destroy, which would make the reason its own.
      const why = sandbox.lostReason ? `crashed: ${await Promise.race([sandbox.lostReason(), lostReasonLate()])}` : undefined;
      if (!isLiveState(entry.info.state)) return;
      return this.end(entry, 'failed', why ?? 'crashed: the sandbox stopped on its own (its init or agent exited)');
    });
  }

  /** `sinceMs` anchors the first CPU share of its usage samples. */
  private markRunning(entry: LiveSandbox, sinceMs: number): void {
    entry.info.state = 'running';
    this.table.save(entry);
    this.ttl.schedule(entry);
    if (entry.sandbox) this.usageSampler.track(entry.sandbox, sinceMs);
  }

  private async pauseEntry(entry: LiveSandbox & { sandbox: BackendSandbox }, keepMemory: boolean): Promise<void> {
    await pauseSandbox(entry, keepMemory, this.now());
    // With onTimeout 'pause' the TTL is suspended while paused; with 'kill' it still applies.
    if (entry.info.spec.onTimeout === 'pause') this.ttl.clear(entry);
    this.table.save(entry);
  }

  private expire(entry: LiveSandbox): void {
    if (entry.info.spec.onTimeout === 'pause' && entry.info.state === 'running' && entry.sandbox) {
      void this.pauseEntry(entry as LiveSandbox & { sandbox: BackendSandbox }, true).catch(() =>
        this.end(entry, 'expired', 'ttl expired; pausing failed'),
      );
      return;
    }
    void this.end(entry, 'expired', 'ttl expired');
  }

  /** Moves a sandbox to an ended state once, destroying its host resources. */
  private end(entry: LiveSandbox, state: 'killed' | 'expired' | 'failed', reason: string): Promise<void> {
    if (entry.ending) return entry.ending;
    this.ttl.clear(entry);
    this.usageSampler.untrack(entry.info.sandboxId);
    entry.info.state = state;
    entry.info.endReason = reason;
    entry.info.endedAt = new Date(this.now()).toISOString();
    entry.ending = (async () => {
      try {
        await Promise.all([entry.sandbox?.destroy(), this.interpreters.close(entry.info.sandboxId)]);
      } catch (error) {
        entry.info.endReason = `${reason}; cleanup failed: ${(error as Error).message}`;
      }
      entry.releaseDisk?.();
      // Kept for an hour (its processes' logs): its record, not its agent and pipes.
      delete entry.sandbox;
      delete entry.files;
      // Its host resources are gone: the room goes to creates waiting for it.
      this.admission.release(entry.info.sandboxId);
      this.table.save(entry);
      this.logs.sandboxEnded(entry.info.sandboxId);
      if (state !== 'failed') this.onEvent({ type: `sandbox.${state}`, sandbox: snapshot(entry) });
      const retiring = this.retire(entry).catch((error: unknown) => {
        process.stderr.write(`capsule: keeping ended sandbox ${entry.info.sandboxId} in memory: ${(error as Error).message}\n`);
      });
      this.retiring.add(retiring);
      void retiring.finally(() => this.retiring.delete(retiring));
    })();
    this.table.save(entry);
    return entry.ending;
  }

  /**
   * Charges the workspace's disk limit to the tenant's quota (QUOTA_EXCEEDED); the volume's
   * promise was made at admission. Returns the release of both.
   */
  private chargeTenantDisk(command: CreateSandboxCommand, spec: SandboxSpec, releaseVolume: () => void): () => void {
    const diskBytes = spec.limits.diskBytes;
    const owner = { tenantId: command.tenantId, quotaBytes: command.grants?.diskQuotaBytes };
    this.workspaceBudget?.reserveWorkspace(owner, diskBytes);
    return once(() => {
      releaseVolume();
      this.workspaceBudget?.releaseWorkspace(owner, diskBytes);
    });
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

/** A lost reason that takes longer than this (a supervisor that does not go) is not waited for. */
function lostReasonLate(): Promise<string> {
  return new Promise((resolve) => setTimeout(() => resolve('the sandbox stopped on its own (its init or agent exited)'), 6000).unref());
}

/**
 * Which warm pool may serve a sandbox of `image`: its template's layer, not its name (a tenant's
 * own `base:latest` and the public one are different roots), or the host template's.
 */
function poolName(image: TemplateImage): string {
  return image.layerDir ?? HOST_TEMPLATE;
}
