import type { ArtifactOutcome, ExecResult, SandboxInfo } from '../wire/index.js';

/** What the engine did, for the audit log and metrics (which live above it). */
export type EngineEvent = {
  type: 'sandbox.created' | 'sandbox.expired' | 'sandbox.crashed' | 'sandbox.recovered' | 'sandbox.killed';
  sandbox: SandboxInfo;
  /** On `sandbox.created`: it came from the warm pool. */
  poolWarm?: boolean;
  /** On `sandbox.recovered` on its files although it had a supervisor: why it was not taken over. */
  reason?: string;
};

/** Which process a `ProcessObserver` call is about. */
export interface ObservedProcess {
  tenantId: string;
  sandboxId: string;
  backend: string;
  pid: number;
}

/**
 * Hooks on the engine's work: a process's start, its settled result (whose output fields are
 * empty: the output is in the process's log), and each artifact delivery. Called synchronously; errors are
 * the observer's.
 */
export interface ProcessObserver {
  onProcessStart?(process: ObservedProcess): void;
  onExecResult?(process: ObservedProcess, result: ExecResult): void;
  onArtifact?(outcome: ArtifactOutcome): void;
}
