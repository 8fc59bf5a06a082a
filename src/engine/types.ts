import type { Readable } from 'node:stream';
import type { NetworkPolicyInput, SandboxSpec, SandboxSpecInput } from '../spec/index.js';
import type { ExecResult, ProcessEnd, Warning } from './result.js';

/**
 * The engine's contract with the server, SDK-facing routes and the E2B facade. The server turns a
 * request into one of these commands; the engine owns live sandboxes, processes and files.
 */
export type SandboxState = 'starting' | 'running' | 'paused' | 'killed' | 'expired' | 'failed';

export interface SandboxInfo {
  sandboxId: string;
  tenantId: string;
  state: SandboxState;
  backend: string;
  spec: SandboxSpec;
  metadata: Record<string, string>;
  createdAt: string;
  /** When the TTL ends the sandbox (ISO 8601). */
  expiresAt: string;
  endedAt?: string;
  /** Why it ended: `killed`, `expired`, `crashed: ...`, `server restarted`. */
  endReason?: string;
  /** Set while paused: what the pause kept, so callers know what a resume will find. */
  pause?: { keepsMemory: boolean; survivesRestart: boolean; pausedAt: string };
}

export interface CreateSandboxCommand {
  tenantId: string;
  spec?: SandboxSpecInput;
  metadata?: Record<string, string>;
  signal?: AbortSignal;
  /**
   * The disk quota of the key that creates the sandbox: its workspace and its processes' logs are
   * charged to the tenant under it. @default the operator's quota (SandboxManagerOptions.workspaceBudget)
   */
  diskQuotaBytes?: number;
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
}

export type ProcessEvent =
  | { type: 'start'; pid: number }
  | { type: 'stdout'; data: Buffer }
  | { type: 'stderr'; data: Buffer }
  | { type: 'warning'; warning: Warning }
  | { type: 'exit'; result: ExecResult };

export interface ProcessInfo {
  pid: number;
  argv: string[];
  cwd: string;
  tag?: string;
  running: boolean;
  startedAt: string;
}

/** A process in a sandbox. Its events can be read from the start by any number of readers. */
export interface ProcessHandle {
  readonly pid: number;
  readonly info: ProcessInfo;
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

export type FileType = 'file' | 'dir' | 'symlink' | 'other';

export interface FileEntry {
  name: string;
  /** Absolute path as the sandbox sees it. */
  path: string;
  type: FileType;
  size: number;
  /** Permission bits, e.g. 0o644. */
  mode: number;
  modifiedAt: string;
  symlinkTarget?: string;
}

export interface WatchEvent {
  type: 'create' | 'write' | 'remove' | 'rename' | 'chmod';
  path: string;
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
  create(command: CreateSandboxCommand): Promise<SandboxInfo>;
  get(tenantId: string, sandboxId: string): SandboxInfo;
  list(query: ListSandboxesQuery): SandboxInfo[];
  kill(tenantId: string, sandboxId: string): Promise<SandboxInfo>;
  /** Sets the TTL to now + ttlMs: it can shorten or extend. */
  setTimeout(tenantId: string, sandboxId: string, ttlMs: number): SandboxInfo;
  startProcess(tenantId: string, sandboxId: string, command: StartProcessCommand): Promise<ProcessHandle>;
  getProcess(tenantId: string, sandboxId: string, pid: number): ProcessHandle;
  listProcesses(tenantId: string, sandboxId: string): ProcessInfo[];
  files(tenantId: string, sandboxId: string): SandboxFiles;
  /** Pauses (keepMemory defaults to true); the answer's `pause` says what was kept. */
  pause(tenantId: string, sandboxId: string, options?: { keepMemory?: boolean }): Promise<SandboxInfo>;
  resume(tenantId: string, sandboxId: string): Promise<SandboxInfo>;
  /** Replaces the network policy; file and process policy stay fixed. */
  setNetworkPolicy(tenantId: string, sandboxId: string, policy: NetworkPolicyInput): Promise<SandboxInfo>;
  close(): Promise<void>;
}
