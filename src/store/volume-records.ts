import type { VolumeInfo } from '../wire/index.js';
import type { SqliteDatabase } from './database.js';

/** Where volume records outlive the process; names are unique per tenant, lookups are by tenant. */
export interface VolumeRecordStore {
  /** Adds a volume; false when the tenant already has one of this name. */
  insert(info: VolumeInfo): boolean;
  get(tenantId: string, name: string): VolumeInfo | undefined;
  list(tenantId: string): VolumeInfo[];
  all(): VolumeInfo[];
  delete(tenantId: string, name: string): void;
}

export class MemoryVolumeRecords implements VolumeRecordStore {
  private readonly records = new Map<string, VolumeInfo>();
  private key(tenantId: string, name: string): string {
    return `${tenantId}\0${name}`;
  }
  insert(info: VolumeInfo): boolean {
    const key = this.key(info.tenantId, info.name);
    if (this.records.has(key)) return false;
    this.records.set(key, structuredClone(info));
    return true;
  }
  get(tenantId: string, name: string): VolumeInfo | undefined {
    const record = this.records.get(this.key(tenantId, name));
    return record ? structuredClone(record) : undefined;
  }
  list(tenantId: string): VolumeInfo[] {
    return this.all().filter((r) => r.tenantId === tenantId);
  }
  all(): VolumeInfo[] {
    return [...this.records.values()].map((r) => structuredClone(r)).sort((a, b) => a.createdAt.localeCompare(b.createdAt));
  }
  delete(tenantId: string, name: string): void {
    this.records.delete(this.key(tenantId, name));
  }
}

/** Volume records in SQLite (table `volumes`). */
export class SqliteVolumeRecords implements VolumeRecordStore {
  constructor(private readonly db: SqliteDatabase) {}

  insert(info: VolumeInfo): boolean {
    const result = this.db
      .prepare('INSERT INTO volumes (volume_id, tenant_id, name, created_at, info) VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING')
      .run(info.volumeId, info.tenantId, info.name, info.createdAt, JSON.stringify(info));
    return result.changes === 1;
  }

  get(tenantId: string, name: string): VolumeInfo | undefined {
    const row = this.db.prepare<[string, string], { info: string }>('SELECT info FROM volumes WHERE tenant_id = ? AND name = ?').get(tenantId, name);
    return row ? (JSON.parse(row.info) as VolumeInfo) : undefined;
  }

  list(tenantId: string): VolumeInfo[] {
    return this.db
      .prepare<[string], { info: string }>('SELECT info FROM volumes WHERE tenant_id = ? ORDER BY created_at, name')
      .all(tenantId)
      .map((row) => JSON.parse(row.info) as VolumeInfo);
  }

  all(): VolumeInfo[] {
    return this.db
      .prepare<[], { info: string }>('SELECT info FROM volumes ORDER BY created_at, name')
      .all()
      .map((row) => JSON.parse(row.info) as VolumeInfo);
  }

  delete(tenantId: string, name: string): void {
    this.db.prepare('DELETE FROM volumes WHERE tenant_id = ? AND name = ?').run(tenantId, name);
  }
}
