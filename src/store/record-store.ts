import type { SandboxInfo } from '../wire/index.js';
import { isLiveState } from '../wire/index.js';

/** Where sandbox records outlive the process: the server keeps them in SQLite. */
export interface SandboxRecordStore {
  upsert(info: SandboxInfo): void;
  /** The record of a sandbox whatever its tenant (callers check the tenant). */
  findById(sandboxId: string): SandboxInfo | undefined;
  /** Records in a live state (starting, running, paused) — after a crash, what to recover. */
  listLive(): SandboxInfo[];
  /**
   * Rows in a live state whose record cannot be read (not JSON, not a sandbox record): what is
   * left of each, for the engine to end it with the reason. Absent: every record is readable.
   */
  listUnreadableLive?(): UnreadableRecord[];
}

/** A sandbox row whose record does not parse: its columns and why. */
export interface UnreadableRecord {
  sandboxId: string;
  tenantId: string;
  createdAt: string;
  metadata: Record<string, string>;
  error: string;
}

/** Keeps records in memory; for one-process use and tests. */
export class MemoryRecordStore implements SandboxRecordStore {
  private readonly records = new Map<string, SandboxInfo>();
  upsert(info: SandboxInfo): void {
    this.records.set(info.sandboxId, structuredClone(info));
  }
  findById(sandboxId: string): SandboxInfo | undefined {
    const info = this.records.get(sandboxId);
    return info && structuredClone(info);
  }
  listLive(): SandboxInfo[] {
    return [...this.records.values()].filter((r) => isLiveState(r.state));
  }
}
