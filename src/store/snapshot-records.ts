import type { SnapshotInfo } from '../wire/index.js';
import type { SqliteDatabase } from './database.js';

/** Where snapshot records outlive the process (the server: SQLite); every lookup is by tenant. */
export interface SnapshotRecordStore {
  upsert(info: SnapshotInfo): void;
  /** The tenant's snapshot; another tenant's id is as missing as an unknown one. */
  get(tenantId: string, snapshotId: string): SnapshotInfo | undefined;
  /** The tenant's snapshots, oldest first. */
  list(tenantId: string): SnapshotInfo[];
  /** Every tenant's (reconciling the disks with the records at start-up). */
  all(): SnapshotInfo[];
  delete(tenantId: string, snapshotId: string): void;
}

/** Keeps records in memory; for one-process use and tests. */
export class MemorySnapshotRecords implements SnapshotRecordStore {
  private readonly records = new Map<string, SnapshotInfo>();
  upsert(info: SnapshotInfo): void {
    this.records.set(info.snapshotId, structuredClone(info));
  }
  get(tenantId: string, snapshotId: string): SnapshotInfo | undefined {
    const record = this.records.get(snapshotId);
    return record && record.tenantId === tenantId ? structuredClone(record) : undefined;
  }
  list(tenantId: string): SnapshotInfo[] {
    return this.all().filter((r) => r.tenantId === tenantId);
  }
  all(): SnapshotInfo[] {
    return [...this.records.values()].map((r) => structuredClone(r)).sort((a, b) => a.createdAt.localeCompare(b.createdAt));
  }
  delete(tenantId: string, snapshotId: string): void {
    if (this.records.get(snapshotId)?.tenantId === tenantId) this.records.delete(snapshotId);
  }
}

/** Snapshot records in SQLite (table `snapshots`), so snapshots survive server restarts. */
export class SqliteSnapshotRecords implements SnapshotRecordStore {
  constructor(private readonly db: SqliteDatabase) {}

  upsert(info: SnapshotInfo): void {
    this.db
      .prepare(
        `INSERT INTO snapshots (snapshot_id, tenant_id, created_at, info) VALUES (@snapshotId, @tenantId, @createdAt, @info)
         ON CONFLICT (snapshot_id) DO UPDATE SET info = excluded.info`,
      )
      .run({ snapshotId: info.snapshotId, tenantId: info.tenantId, createdAt: info.createdAt, info: JSON.stringify(info) });
  }

  get(tenantId: string, snapshotId: string): SnapshotInfo | undefined {
    const row = this.db.prepare<[string, string], { info: string }>('SELECT info FROM snapshots WHERE tenant_id = ? AND snapshot_id = ?').get(tenantId, snapshotId);
    return row ? (JSON.parse(row.info) as SnapshotInfo) : undefined;
  }

  list(tenantId: string): SnapshotInfo[] {
    const rows = this.db.prepare<[string], { info: string }>('SELECT info FROM snapshots WHERE tenant_id = ? ORDER BY created_at, snapshot_id').all(tenantId);
    return rows.map((row) => JSON.parse(row.info) as SnapshotInfo);
  }

  all(): SnapshotInfo[] {
    const rows = this.db.prepare<[], { info: string }>('SELECT info FROM snapshots ORDER BY created_at, snapshot_id').all();
    return rows.map((row) => JSON.parse(row.info) as SnapshotInfo);
  }

  delete(tenantId: string, snapshotId: string): void {
    this.db.prepare('DELETE FROM snapshots WHERE tenant_id = ? AND snapshot_id = ?').run(tenantId, snapshotId);
  }
}
