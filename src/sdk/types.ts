/**
 * The wire types the SDK returns: the wire contract's own (src/wire; type-only imports, so no
 * schema is loaded), which the server validates and documents with the same schemas.
 */
export type {
  ApplyResult,
  CapacityInfo,
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
export type { NetworkPolicyInput, SandboxSpec, SandboxSpecInput } from '../sandbox-spec/index.js';

/** Per-call options every SDK method takes. */
export interface CallOptions {
  /** Deadline of the request. @default the client's timeoutMs (60000) */
  timeoutMs?: number;
  signal?: AbortSignal;
}

/** A signed URL to a port of a sandbox (`sandbox.portUrl(port)`). */
export interface PortUrl {
  /** Path form on the server (`…/v1/sandboxes/ID/ports/P/?capsule_token=…`): works as it is. */
  url: string;
  /** Host form `http://P-ID.DOMAIN/?capsule_token=…`, when the server has a public domain. */
  hostUrl?: string;
  /** The signed token, also accepted as the `capsule_port_token` cookie. */
  token: string;
  /** When the URL stops working (ISO 8601). */
  expiresAt: string;
}
