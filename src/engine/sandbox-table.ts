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

/** The processes of sandboxes that left memory (SandboxTable.retire), kept beside their logs. */
export interface RetiredProcesses {
  /** Whether `sandboxId`'s logs, and so its processes, are still kept. */
  kept(sandboxId: string): boolean;
  /** Its processes, read from disk (none when its logs went in between). */
  read(sandboxId: string): ProcessTable;
}

/**
 * The engine's sandboxes by id, scoped by tenant on every lookup, and their records: every change
 * of `info` is saved to the record store with `save`. An ended sandbox leaves memory once its
 * processes' records are on disk (`retire`); while its logs are kept, a lookup reads its
 * record back from the store and its processes from beside their logs (`RetiredProcesses`).
 */
export class SandboxTable {
  private readonly entries = new Map<string, LiveSandbox>();

  constructor(
    private readonly store: SandboxRecordStore,
    /** Where a retired sandbox's processes are read back from, while its logs are kept. */
    private readonly ended?: RetiredProcesses,
  ) {}

  add(entry: LiveSandbox): void {
    this.entries.set(entry.info.sandboxId, entry);
  }

  get(sandboxId: string): LiveSandbox | undefined {
    return this.entries.get(sandboxId);
  }

  /**
   * Lets go of an ended sandbox (a live one stays): once its processes' records are on disk, or
   * once its logs are gone. `find` reads it back while its logs are kept.
   */
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

  /**
   * A retired sandbox read back while its logs are kept: its record, and its processes read from
   * disk only when asked for (a `get` reads the record alone).
   */
  private retired(sandboxId: string): LiveSandbox | undefined {
    const { ended } = this;
    if (!ended?.kept(sandboxId)) return undefined;
    const info = this.store.findById(sandboxId);
    if (!info || isLiveState(info.state)) return undefined;
    let processes: ProcessTable | undefined;
    return {
      info,
      get processes(): ProcessTable {
        processes ??= ended.read(sandboxId);
        return processes;
      },
    };
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
