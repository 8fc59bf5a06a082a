import { SandboxError } from '../errors/index.js';
import type { BackendSandbox } from '../backends/backend.js';
import type { SandboxRecordStore } from '../store/index.js';
import { isLiveState, type SandboxInfo } from '../wire/index.js';
import type { ProcessTable } from './process-table.js';
import type { SandboxFiles } from './types.js';

/** One sandbox the engine knows: its record, and while it runs, its backend sandbox and processes. */
export interface LiveSandbox {
  info: SandboxInfo;
  sandbox?: BackendSandbox;
  processes: ProcessTable;
  files?: SandboxFiles;
  timer?: NodeJS.Timeout;
  /** Set once the sandbox is ending: settles when its host resources are gone. */
  ending?: Promise<void>;
  /** The disk quota its creator's key has (undefined: the operator's, and after a restart). */
  quotaBytes?: number;
  /** Gives back its disk limit to the volume and the tenant's quota; once. */
  releaseDisk?: () => void;
  /** Set while a resume runs: concurrent resumes (auto-resume by several calls at once) wait for it. */
  resuming?: Promise<void>;
}

/**
 * The engine's sandboxes by id, scoped by tenant on every lookup, and their records: every change
 * of `info` is saved to the record store with `save`. An ended sandbox leaves memory once its
 * processes' records are on disk (`retire`); a lookup reads it back from the store and
 * `readEnded` while its logs are kept.
 */
export class SandboxTable {
  private readonly entries = new Map<string, LiveSandbox>();

  constructor(
    private readonly store: SandboxRecordStore,
    /** The processes of a retired sandbox, read back; undefined once its logs are gone. */
    private readonly readEnded: (sandboxId: string) => ProcessTable | undefined = () => undefined,
  ) {}

  add(entry: LiveSandbox): void {
    this.entries.set(entry.info.sandboxId, entry);
  }

  get(sandboxId: string): LiveSandbox | undefined {
    return this.entries.get(sandboxId);
  }

  /** Forgets an ended sandbox (once its logs are gone, nothing of it is left to read). */
  delete(sandboxId: string): void {
    this.entries.delete(sandboxId);
  }

  /** Lets go of an ended sandbox whose processes' records are on disk; `find` reads it back. */
  retire(sandboxId: string): void {
    const entry = this.entries.get(sandboxId);
    if (entry && !isLiveState(entry.info.state)) this.entries.delete(sandboxId);
  }

  all(): LiveSandbox[] {
    return [...this.entries.values()];
  }

  save(entry: LiveSandbox): void {
    this.store.upsert(snapshot(entry));
  }

  /** The tenant's sandbox; a foreign or unknown id is SANDBOX_NOT_FOUND (never 403). */
  find(tenantId: string, sandboxId: string): LiveSandbox {
    const entry = this.entries.get(sandboxId) ?? this.retired(sandboxId);
    if (!entry || entry.info.tenantId !== tenantId) {
      throw new SandboxError('SANDBOX_NOT_FOUND', `sandbox ${sandboxId} not found`, {
        details: { sandboxId },
        hint: 'Check the id; sandboxes of other tenants are not visible.',
      });
    }
    return entry;
  }

  /** A retired sandbox read back: its record and its processes, or undefined once its logs are gone. */
  private retired(sandboxId: string): LiveSandbox | undefined {
    const processes = this.readEnded(sandboxId);
    const info = processes && this.store.findById(sandboxId);
    return info && !isLiveState(info.state) ? { info, processes } : undefined;
  }

  /** Starting, running or paused; an ended one is SANDBOX_NOT_RUNNING with its end reason. */
  findLive(tenantId: string, sandboxId: string): LiveSandbox {
    const entry = this.find(tenantId, sandboxId);
    if (!isLiveState(entry.info.state)) {
      throw new SandboxError('SANDBOX_NOT_RUNNING', `sandbox ${sandboxId} is ${entry.info.state}${entry.info.endReason ? ` (${entry.info.endReason})` : ''}`, {
        details: { sandboxId, state: entry.info.state },
        hint: 'Create a new sandbox.',
      });
    }
    return entry;
  }

  /** Running, with its backend sandbox: what every call that acts inside a sandbox needs. */
  findRunning(tenantId: string, sandboxId: string): LiveSandbox & { sandbox: BackendSandbox } {
    const entry = this.findLive(tenantId, sandboxId);
    if (entry.info.state !== 'running' || !entry.sandbox) {
      throw new SandboxError('SANDBOX_NOT_RUNNING', `sandbox ${sandboxId} is ${entry.info.state}`, {
        details: { sandboxId, state: entry.info.state },
        hint: entry.info.state === 'paused' ? 'Resume the sandbox first.' : 'Wait until it is running.',
      });
    }
    return entry as LiveSandbox & { sandbox: BackendSandbox };
  }
}

/** A copy of the record: callers never hold the engine's own object. */
export function snapshot(entry: LiveSandbox): SandboxInfo {
  return structuredClone(entry.info);
}
