import type { AgentProcess, AgentRelay, AgentStartOptions } from './agent/index.js';
import type { BackendName, NetworkPolicy, SandboxSpec } from '../sandbox-spec/index.js';
import type { CgroupCounters } from '../host/cgroups.host.js';
import type { HostMount } from '../host/mount-roots.host.js';
import type { EgressCounters } from '../host/egress/egress-types.js';


/** What a backend can enforce. The engine refuses a spec that needs one the backend lacks. */
export const CAPABILITIES = [
  'limits.cpus',
  'limits.memory',
  'limits.pids',
  'limits.disk',
  'limits.fileSize',
  'limits.openFiles',
  'limits.tmp',
  'mounts.readOnly',
  'network.none',
  'network.allowlist',
  'network.internet',
  'pause.freeze',
  'pause.keepMemoryOnDisk',
  'volumes',
] as const;
export type Capability = (typeof CAPABILITIES)[number];

export interface BackendProbe {
  available: boolean;
  /** Why it is unavailable, in words an operator can act on. */
  reason?: string;
  capabilities: readonly Capability[];
}

/**
 * Kernel counters of one sandbox, and the egress proxy's for it (sandboxes with a network only);
 * deltas across an exec classify how it ended.
 */
export interface SandboxCounters extends CgroupCounters, EgressCounters {}

export type ExecRequest = AgentStartOptions;

/** A live sandbox as a backend holds it: a resident agent, its limits, its workspace. */
export interface BackendSandbox {
  readonly id: string;
  readonly backend: BackendName;
  readonly spec: SandboxSpec;
  /** Host path of the workspace (the sandbox sees it as /workspace). */
  readonly workspaceDir: string;
  /** Resolves when the sandbox stopped on its own (agent gone): crash, OOM of the agent, kill. */
  readonly lost: Promise<void>;
  exec(request: ExecRequest): Promise<AgentProcess>;
  /**
   * A TCP connection to `port` on the sandbox's own loopback, relayed by its agent: it needs no
   * network in the sandbox and changes nothing of its outbound policy. PORT_NOT_LISTENING when
   * nothing accepts there.
   */
  connectPort(port: number, options?: ConnectPortOptions): Promise<AgentRelay>;
  counters(): Promise<SandboxCounters>;
  memoryUsageBytes(): Promise<number>;
  /** Bytes in the workspace as the disk limit counts them. */
  diskUsedBytes(): Promise<number | undefined>;
  /** Clears the peak-memory watermark so the next exec reports its own peak. */
  resetPeak(): Promise<void>;
  freeze(): Promise<void>;
  thaw(): Promise<void>;
  /**
   * Replaces the network policy (file and process policy stay fixed). New connections follow it
   * within 100 ms and open connections it no longer allows are closed. A sandbox created without
   * a network cannot gain one: BACKEND_CANNOT_ENFORCE.
   */
  setNetworkPolicy?(policy: NetworkPolicy): Promise<void>;
  /** Kills every process and removes every host resource. Safe to call twice. */
  destroy(): Promise<void>;
  /** Why the sandbox stopped on its own (`agent exited 137`, `supervisor gone`), once `lost` resolved. */
  lostReason?(): Promise<string>;
  /**
   * Lets go of a sandbox held by a supervisor that outlives this process: it keeps running and a
   * later Capsule process reattaches (`Backend.reattach`). False when this sandbox cannot.
   */
  detach?(): boolean;
  /**
   * Re-limits a warm (pooled, never used) sandbox for a spec that `Backend.poolKey` gave the same
   * key: cgroup limits and the disk quota change in place, and `spec` becomes the new one.
   */
  adopt?(spec: SandboxSpec): Promise<void>;
  /**
   * Stops the sandbox's work until `resume()`. `keepMemory: true` keeps processes and their memory
   * (gVisor: a checkpoint on disk that frees CPU and RAM; namespace: a frozen cgroup, still in RAM);
   * `keepMemory: false` ends every process and keeps only the files. Absent on a backend that
   * cannot pause.
   */
  pause?(options: PauseOptions): Promise<PauseResult>;
  /** Continues a paused sandbox: restored processes, or a fresh agent when memory was not kept. */
  resume?(): Promise<void>;
  /**
   * Running processes the host can talk to. After `Backend.restore()` and `resume()` in a new
   * Capsule process these are new handles (same ids and pids, stdin and exit work; output written
   * while no host listened is gone) to the processes the previous Capsule process started.
   */
  processes?(): readonly AgentProcess[];
}

export interface ConnectPortOptions {
  signal?: AbortSignal;
  /** How long the agent may take to answer. @default 10000 */
  timeoutMs?: number;
}

export interface PauseOptions {
  keepMemory: boolean;
}

/** What a pause kept; the API says it back so callers know what a resume will find. */
export interface PauseResult {
  /** Processes and their memory continue after resume. */
  keepsMemory: boolean;
  /** The paused sandbox can be resumed by a new Capsule process (after a server restart). */
  survivesRestart: boolean;
}

export interface CreateOptions {
  id: string;
  signal?: AbortSignal;
  /** Start on the workspace a previous process of Capsule left for this id (crash recovery). */
  reuseWorkspace?: boolean;
  /**
   * The spec's host mounts, resolved by the engine, in the order of `spec.mounts`. A spec with
   * mounts and no resolved mounts is refused: a backend never resolves a tenant's mount itself.
   */
  mounts?: readonly HostMount[];
  /**
   * The template layer the sandbox is made from (a read-only subvolume on the workspace volume):
   * its root is a private writable snapshot of it, seen through an idmapped mount, with root
   * inside its own user namespace. Absent: the host template (the host's /usr, uid 1000).
   */
  template?: { layerDir: string };
  /**
   * A sandbox of the host template made from a snapshot: its workspace starts as a writable
   * copy-on-write snapshot of this read-only subvolume (the source's workspace), owned by the new
   * sandbox's uid.
   */
  workspaceFrom?: string;
  /** The host directories of `spec.volumes`, in its order (the engine resolved them per tenant). */
  volumes?: readonly string[];
  /**
   * The tenant the sandbox belongs to: the credential broker serves it only the handles the
   * operator granted to this tenant. @default 'default' (the operator's own, e.g. one-shot runs)
   */
  tenantId?: string;
}

/** What a reattach needs beyond the record's spec: what the engine resolves for a create too. */
export interface ReattachOptions {
  /** The sandbox's tenant (the broker's grants, when it has a network). @default 'default' */
  tenantId?: string;
  /** The spec's host mounts, resolved again (a resume after a pause mounts them anew). */
  mounts?: readonly HostMount[];
  /** The host directories of `spec.volumes`, in its order (lent volumes are given back at the end). */
  volumes?: readonly string[];
}

export interface ReconcileReport {
  /** Host resources of sandboxes not in the live set, removed. */
  removed: string[];
  failures: string[];
}

/** The one narrow interface every isolation backend implements. */
export interface Backend {
  readonly name: BackendName;
  /**
   * Specs with the same key can share warm sandboxes: what differs between them can be changed on
   * a live sandbox with `adopt`. Undefined: this spec cannot come from a pool.
   */
  poolKey?(spec: SandboxSpec): string | undefined;
  probe(): Promise<BackendProbe>;
  create(spec: SandboxSpec, options: CreateOptions): Promise<BackendSandbox>;
  /**
   * At start-up: removes every sandbox's processes and cgroups left by a previous Capsule process
   * except those in `reattached` (taken over by `reattach`), and the workspaces of ids not in `liveIds`.
   */
  reconcile(liveIds: ReadonlySet<string>, reattached?: ReadonlySet<string>): Promise<ReconcileReport>;
  /**
   * At start-up, before `reconcile`: takes over a running sandbox whose supervisor outlived the
   * previous Capsule process (same processes, output kept meanwhile replayed). Undefined when
   * there is none to take over; `reconcile` then removes what is left of it.
   */
  reattach?(id: string, spec: SandboxSpec, options?: ReattachOptions): Promise<BackendSandbox | undefined>;
  /**
   * Takes over a sandbox that a previous Capsule process paused with a result saying
   * `survivesRestart` (gVisor: its checkpoint on disk), still paused; `resume()` continues it.
   * Absent on a backend whose pause does not survive a restart.
   */
  restore?(id: string, spec: SandboxSpec, options?: { mounts?: readonly HostMount[] }): Promise<BackendSandbox>;
  /**
   * Releases what the backend holds on the host beyond single sandboxes (namespace: the egress
   * proxy, the network namespace pool, host nftables rules). Sandboxes are destroyed first.
   */
  close?(): Promise<void>;
}
