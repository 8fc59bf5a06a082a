import type { SandboxInfo } from '../wire/index.js';
import { isLiveState } from '../wire/index.js';

/** Where sandbox records outlive the process: the server keeps them in SQLite. */
export interface SandboxRecordStore {
  upsert(info: SandboxInfo): void;
  /** Records in a live state (starting, running, paused) — after a crash, what to recover. */
  listLive(): SandboxInfo[];
}

/** Keeps records in memory; for one-process use and tests. */
export class MemoryRecordStore implements SandboxRecordStore {
  private readonly records = new Map<string, SandboxInfo>();
  upsert(info: SandboxInfo): void {
    this.records.set(info.sandboxId, structuredClone(info));
  }
  listLive(): SandboxInfo[] {
    return [...this.records.values()].filter((r) => isLiveState(r.state));
  }
}
