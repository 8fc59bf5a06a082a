/**
 * The wire types the SDK returns: the wire contract's own (src/wire; type-only imports, so no
 * schema is loaded), which the server validates and documents with the same schemas.
 */
export type {
  ApplyResult,
  Change,
  Changes,
  ExecReply,
  ExecResult,
  FileEntry,
  FileType,
  LimitHit,
  LimitResource,
  Outcome,
  ProcessInfo,
  SandboxInfo,
  SandboxPage,
  SandboxState,
  SnapshotInfo,
  Usage,
  VolumeInfo,
  Warning,
  WatchEvent,
  WireProcessEvent,
} from '../wire/index.js';
export type { NetworkPolicyInput, SandboxSpec, SandboxSpecInput } from '../spec/index.js';

/** Per-call options every SDK method takes. */
export interface CallOptions {
  /** Deadline of the request. @default the client's timeoutMs (60000) */
  timeoutMs?: number;
  signal?: AbortSignal;
}
