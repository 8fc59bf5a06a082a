/**
 * The wire types the SDK returns. They are the engine's own types (type-only imports: nothing of
 * the engine is loaded), so the server and the SDK cannot drift apart silently.
 */
export type {
  FileEntry,
  FileType,
  ProcessInfo,
  SandboxInfo,
  SandboxState,
  WatchEvent,
} from '../engine/types.js';
export type { ExecResult, LimitHit, LimitResource, Outcome, Usage, Warning } from '../engine/result.js';
export type { SandboxSpec, SandboxSpecInput } from '../spec/index.js';
export type { NetworkPolicyInput } from '../engine/sandbox-manager.js';

import type { ExecResult, Warning } from '../engine/result.js';

/** A process event as it travels: output is base64. */
export type WireProcessEvent =
  | { type: 'start'; pid: number }
  | { type: 'stdout'; data: string }
  | { type: 'stderr'; data: string }
  | { type: 'warning'; warning: Warning }
  | { type: 'exit'; result: ExecResult }
  /** The server failed mid-stream; the code is a wire error code. */
  | { type: 'error'; error: { code: string; message: string; hint?: string; requestId?: string } };

/** Per-call options every SDK method takes. */
export interface CallOptions {
  /** Deadline of the request. @default the client's timeoutMs (60000) */
  timeoutMs?: number;
  signal?: AbortSignal;
}
