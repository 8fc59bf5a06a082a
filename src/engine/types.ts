import type { Duplex, Readable } from 'node:stream';
import type { NetworkPolicyInput, OperatorMaxima, SandboxSpecInput } from '../sandbox-spec/index.js';
import type { CapacityInfo, ExecResult, FileEntry, ForkResult, ProcessInfo, SandboxInfo, SandboxState, SnapshotInfo, UsageSample, VolumeInfo, Warning, WatchEvent, ApplyResult, Changes, CreateVolumeInput } from '../wire/index.js';
import type { Collection, CollectOptions } from './artifacts.js';
import type { InterpreterService } from './interpreter/index.js';

/** What a caller chooses of a collection; the engine sets the tenant, metrics hook and freezing. */
export type EngineCollectOptions = Pick<CollectOptions, 'dir' | 'maxFileBytes' | 'maxTotalBytes' | 'signal' | 'reserve'>;
import type { ProcessEnd } from './result.js';

/**
 * The engine's contract with the server, SDK-facing routes and the E2B facade. The server turns a
 * request into one of these commands; the engine owns live sandboxes, processes and files.
 */
export interface CreateSandboxCommand {
  tenantId: string;
  spec?: SandboxSpecInput;
  metadata?: Record<string, string>;
  signal?: AbortSignal;
  /**
   * When the host cannot back the sandbox now, wait up to this long for room (first come first
   * served) before CAPACITY_EXHAUSTED; at most the operator's maximum. @default 0: refused at once
   */
  waitForCapacityMs?: number;
  /**
   * What the caller's API key was granted: the operator's mount roots it may name in
   * `spec.mounts` ('all' for the operator's own key) and its disk quota. @default no roots
   */
  grants?: {
    mountRoots: readonly string[] | 'all';
    /**
     * The tenant's disk quota for work made with this key: the workspace and its processes' logs
     * are charged under it. @default the operator's quota (SandboxManagerOptions.workspaceBudget)
     */
    diskQuotaBytes?: number;
  };
}

export interface ForkOptions {
  count: number;
  /** `full`: each fork resumes the source's processes and memory (gVisor). @default 'filesystem' */
  mode?: 'filesystem' | 'full';
  /** Added to each fork's metadata (beside `forkOf` and `forkIndex`). */
  metadata?: Record<string, string>;
  signal?: AbortSignal;
  /** As for create: the caller's mount roots, which the source's mounts need again. */
  grants?: CreateSandboxCommand['grants'];
}

export interface ListSandboxesQuery {
  tenantId: string;
  states?: SandboxState[];
  metadata?: Record<string, string>;
}

export interface StartProcessCommand {
  argv: string[];
  /** @default spec.cwd */
  cwd?: string;
  /** Added on top of the spec's environment. */
  env?: Record<string, string>;
  /** Wall-clock limit of this process. @default spec.limits.wallClockMs */
  timeoutMs?: number;
  /** Keep stdin open for writeStdin/closeStdin. @default false */
  stdin?: boolean;
  pty?: { cols: number; rows: number };
  /** Free-form label, returned by listProcesses. */
  tag?: string;
  /**
   * The user to run as: `root`, or a user name, uid or uid:gid of the template. Only sandboxes
   * from a template have users to choose from. @default spec.user (the template's user)
   */
  user?: string;
}

export type ProcessEvent =
  | { type: 'start'; pid: number }
  | { type: 'stdout'; data: Buffer }
  | { type: 'stderr'; data: Buffer }
  | { type: 'warning'; warning: Warning }
  | { type: 'exit'; result: ExecResult };

/** A process in a sandbox. Its events can be read from the start by any number of readers. */
export interface ProcessHandle {
  readonly pid: number;
  readonly info: ProcessInfo;
  /** Started with a pty (also when a restarted server took it over). */
  readonly isPty: boolean;
  /** Every event from the start (kept output is replayed), then live ones, ending with `exit`. */
  events(signal?: AbortSignal): AsyncIterable<ProcessEvent>;
  /** The result, with at most 1 MiB of each stream inline (read back from the log). */
  readonly result: Promise<ExecResult>;
  /** How the process ended, without its output: for callers that need no output. */
  readonly ended: Promise<ProcessEnd>;
  /** Writes what the process's log holds in memory, so a reader of the file sees all output so far. */
  flushLog(): Promise<void>;
  writeStdin(data: Buffer | string): void;
  closeStdin(): void;
  signal(signal: NodeJS.Signals): void;
  resize(cols: number, rows: number): void;
}

/** File operations as the sandbox sees paths: never a host path, whatever symlinks say. */
export interface SandboxFiles {
  read(path: string, options?: { signal?: AbortSignal }): Promise<Readable>;
  /** Atomic: readers see the old or the new content, never a part. Parents are created. */
  write(path: string, data: Readable | Buffer | string, options?: { signal?: AbortSignal }): Promise<FileEntry>;
  list(path: string, depth?: number): Promise<FileEntry[]>;
  stat(path: string): Promise<FileEntry>;
  mkdir(path: string): Promise<FileEntry>;
  move(source: string, destination: string): Promise<FileEntry>;
  remove(path: string): Promise<void>;
  watch(path: string, options?: { recursive?: boolean; signal?: AbortSignal }): AsyncIterable<WatchEvent>;
}

export interface SandboxEngine {
  /** The operator's ceilings every spec is checked against. */
  readonly maxima: OperatorMaxima;
  /** The names of the operator's mount roots (what an API key can be granted). */
  readonly mountRootNames: readonly string[];
  create(command: CreateSandboxCommand): Promise<SandboxInfo>;
  /** What the server can still admit, and `tenantId`'s own quota (GET /v1/capacity). */
  capacityOf(tenantId: string): Promise<CapacityInfo>;
  get(tenantId: string, sandboxId: string): SandboxInfo;
  /**
   * The sandboxes the engine holds: the live ones, and ended ones until their processes' records
   * are written out of memory (moments after the end). Ended sandboxes stay readable by id (`get`,
   * their processes) while their logs are kept; the server lists them from its record store.
   */
  list(query: ListSandboxesQuery): SandboxInfo[];
  kill(tenantId: string, sandboxId: string): Promise<SandboxInfo>;
  /** Sets the TTL to now + ttlMs: it can shorten or extend. */
  setTimeout(tenantId: string, sandboxId: string, ttlMs: number): SandboxInfo;
  startProcess(tenantId: string, sandboxId: string, command: StartProcessCommand): Promise<ProcessHandle>;
  getProcess(tenantId: string, sandboxId: string, pid: number): ProcessHandle;
  listProcesses(tenantId: string, sandboxId: string): ProcessInfo[];
  files(tenantId: string, sandboxId: string): SandboxFiles;
  /**
   * A TCP connection to `port` on the sandbox's own loopback, carried by its agent (no network
   * needed in the sandbox; its outbound policy is unchanged). PORT_NOT_LISTENING when nothing
   * accepts there; SANDBOX_NOT_RUNNING when it is paused or ended.
   */
  connectPort(tenantId: string, sandboxId: string, port: number, options?: { signal?: AbortSignal }): Promise<Duplex>;
  /** Pauses (keepMemory defaults to true); the answer's `pause` says what was kept. */
  pause(tenantId: string, sandboxId: string, options?: { keepMemory?: boolean }): Promise<SandboxInfo>;
  resume(tenantId: string, sandboxId: string): Promise<SandboxInfo>;
  /** Resumes a paused sandbox created with `autoResume` before a call acts inside it; otherwise does nothing. */
  wake(tenantId: string, sandboxId: string): Promise<void>;
  /** Replaces the network policy; file and process policy stay fixed. */
  setNetworkPolicy(tenantId: string, sandboxId: string, policy: NetworkPolicyInput): Promise<SandboxInfo>;
  /** The interpreter contexts of a running sandbox, shared by every API surface. */
  interpreter(tenantId: string, sandboxId: string): InterpreterService;
  /** Usage samples of the sandbox, oldest first, plus one taken now while it runs. */
  usage(tenantId: string, sandboxId: string): Promise<UsageSample[]>;
  /** Copies a directory of a running sandbox into the artifact store (the sandbox frozen meanwhile). */
  collectArtifacts(tenantId: string, sandboxId: string, options: EngineCollectOptions): Promise<Collection>;
  /** A snapshot of a running or paused sandbox: root and workspace at one instant (frozen for it). */
  snapshot(tenantId: string, sandboxId: string, options?: { name?: string; mode?: 'filesystem' | 'full'; includeVolumes?: boolean }): Promise<SnapshotInfo>;
  getSnapshot(tenantId: string, snapshotId: string): SnapshotInfo;
  listSnapshots(tenantId: string): SnapshotInfo[];
  /** Deletes a snapshot and its data; CONFLICT while a live sandbox was made from it. */
  deleteSnapshot(tenantId: string, snapshotId: string): Promise<void>;
  /** N sandboxes from one snapshot of the source, each reported on its own. */
  fork(tenantId: string, sandboxId: string, options: ForkOptions): Promise<ForkResult>;
  /** Added, modified and deleted paths against the snapshot or template the sandbox came from (or `since`). */
  changes(tenantId: string, sandboxId: string, options?: { since?: string }): Promise<Changes>;
  /** The added and modified entries against the origin (or `since`) as a tar stream. */
  exportChanges(tenantId: string, sandboxId: string, options?: { since?: string }): Promise<Readable>;
  /** Applies the changes of `from`, a fork of this sandbox; CONFLICT with the paths both changed. */
  applyChanges(tenantId: string, sandboxId: string, options: { from: string }): Promise<ApplyResult>;
  /**
   * A named volume of the tenant (ALREADY_EXISTS for a name it has), empty or (`from`) a copy of
   * one a snapshot kept; its size is charged to the tenant's disk quota under `owner.quotaBytes`
   * (the creating key's).
   */
  createVolume(tenantId: string, input: CreateVolumeInput, owner?: { quotaBytes?: number }): Promise<VolumeInfo>;
  /** The tenant's volume with its usage, by name or (`by: 'id'`) by volume id; VOLUME_NOT_FOUND otherwise. */
  getVolume(tenantId: string, key: string, by?: 'name' | 'id'): Promise<VolumeInfo>;
  listVolumes(tenantId: string): Promise<VolumeInfo[]>;
  /** Deletes a volume (by name, or `by: 'id'`) and its data; CONFLICT while a live sandbox mounts it. */
  deleteVolume(tenantId: string, key: string, by?: 'name' | 'id'): Promise<void>;
  /**
   * Stops the engine. Every live sandbox is killed, except with `keepSandboxes`: running ones held
   * by a supervisor (`capsule serve`) are let go and keep running for the next start, which
   * reattaches, and ones paused to disk (gVisor checkpoints) stay paused for it to restore; their
   * ids go to `onLeftRunning`. The rest (a frozen namespace sandbox) is killed.
   */
  close(options?: EngineCloseOptions): Promise<void>;
}

export interface EngineCloseOptions {
  keepSandboxes?: boolean;
  onLeftRunning?: (sandboxIds: string[]) => void;
}
