import type DatabaseType from 'better-sqlite3';
import { artifactUri, SHA256_PATTERN, type Artifact, type ArtifactListQuery } from './types.js';

/** One artifact as the index stores it; times in epoch milliseconds. */
export interface ArtifactRow {
  id: string;
  sha256: string;
  name: string;
  path: string;
  size: number;
  tenantId: string;
  sandboxId: string;
  createdAt: number;
  expiresAt: number;
}

const SCHEMA = `
CREATE TABLE IF NOT EXISTS artifacts (
  id TEXT PRIMARY KEY,
  sha256 TEXT NOT NULL,
  name TEXT NOT NULL,
  path TEXT NOT NULL,
  size INTEGER NOT NULL,
  tenant_id TEXT NOT NULL,
  sandbox_id TEXT NOT NULL,
  created_at INTEGER NOT NULL,
  expires_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS artifacts_sha256 ON artifacts (sha256);
CREATE INDEX IF NOT EXISTS artifacts_tenant ON artifacts (tenant_id, created_at);
CREATE INDEX IF NOT EXISTS artifacts_sandbox ON artifacts (sandbox_id);
CREATE INDEX IF NOT EXISTS artifacts_expires ON artifacts (expires_at);
`;

const COLUMNS = `id, sha256, name, path, size, tenant_id AS tenantId, sandbox_id AS sandboxId,
  created_at AS createdAt, expires_at AS expiresAt`;

const DEFAULT_LIST_LIMIT = 1000;

/** The SQLite metadata of the local artifact store. Synchronous: better-sqlite3 is. */
export class ArtifactIndex {
  constructor(private readonly db: DatabaseType.Database) {
    db.pragma('journal_mode = WAL');
    // A commit need not reach the disk at once: a row lost in a crash leaves an unreferenced blob
    // (removed by the sweep), never a row without its blob (the blob is durable before the row
    // is written).
    db.pragma('synchronous = NORMAL');
    db.pragma('busy_timeout = 5000');
    db.exec(SCHEMA);
  }

  /** Runs `fn` in an immediate (write-locked) transaction: other processes wait for it. */
  write<T>(fn: () => T): T {
    return this.db.transaction(fn).immediate();
  }

  insert(row: ArtifactRow): void {
    this.db
      .prepare(`INSERT INTO artifacts (id, sha256, name, path, size, tenant_id, sandbox_id, created_at, expires_at)
        VALUES (@id, @sha256, @name, @path, @size, @tenantId, @sandboxId, @createdAt, @expiresAt)`)
      .run(row);
  }

  /** The newest live row of an id or a digest, within a tenant when one is given. */
  find(ref: string, tenantId: string | undefined, nowMs: number): ArtifactRow | undefined {
    const column = SHA256_PATTERN.test(ref) ? 'sha256' : 'id';
    const tenant = tenantId === undefined ? '' : 'AND tenant_id = @tenantId';
    return this.db
      .prepare(`SELECT ${COLUMNS} FROM artifacts WHERE ${column} = @ref AND expires_at > @nowMs ${tenant}
        ORDER BY created_at DESC LIMIT 1`)
      .get({ ref, nowMs, tenantId }) as ArtifactRow | undefined;
  }

  list(query: ArtifactListQuery, nowMs: number): ArtifactRow[] {
    const where = ['expires_at > @nowMs'];
    if (query.tenantId !== undefined) where.push('tenant_id = @tenantId');
    if (query.sandboxId !== undefined) where.push('sandbox_id = @sandboxId');
    return this.db
      .prepare(`SELECT ${COLUMNS} FROM artifacts WHERE ${where.join(' AND ')} ORDER BY created_at, id LIMIT @limit`)
      .all({ nowMs, tenantId: query.tenantId, sandboxId: query.sandboxId, limit: query.limit ?? DEFAULT_LIST_LIMIT }) as ArtifactRow[];
  }

  /** Deletes the rows of an id or a digest; returns the digests they pointed at. */
  remove(ref: string, tenantId: string | undefined): string[] {
    const column = SHA256_PATTERN.test(ref) ? 'sha256' : 'id';
    const tenant = tenantId === undefined ? '' : 'AND tenant_id = @tenantId';
    const rows = this.db
      .prepare(`DELETE FROM artifacts WHERE ${column} = @ref ${tenant} RETURNING sha256`)
      .all({ ref, tenantId }) as { sha256: string }[];
    return [...new Set(rows.map((r) => r.sha256))];
  }

  /** Bytes of live rows per tenant (of one tenant, when given). */
  bytesByTenant(nowMs: number, tenantId?: string): Map<string, number> {
    const tenant = tenantId === undefined ? '' : 'AND tenant_id = @tenantId';
    const rows = this.db
      .prepare(`SELECT tenant_id AS tenantId, SUM(size) AS bytes FROM artifacts WHERE expires_at > @nowMs ${tenant} GROUP BY tenant_id`)
      .all({ nowMs, tenantId }) as { tenantId: string; bytes: number }[];
    return new Map(rows.map((r) => [r.tenantId, r.bytes]));
  }

  /** Deletes rows whose retention ended; returns how many. */
  removeExpired(nowMs: number): number {
    return this.db.prepare('DELETE FROM artifacts WHERE expires_at <= @nowMs').run({ nowMs }).changes;
  }

  /** Rows (live or expired) that still point at a blob. */
  references(sha256: string): number {
    return (this.db.prepare('SELECT COUNT(*) AS n FROM artifacts WHERE sha256 = ?').get(sha256) as { n: number }).n;
  }

  close(): void {
    this.db.close();
  }
}

export function toArtifact(row: ArtifactRow): Artifact {
  return {
    id: row.id,
    name: row.name,
    path: row.path,
    size: row.size,
    sha256: row.sha256,
    uri: artifactUri(row.sha256),
    tenantId: row.tenantId,
    sandboxId: row.sandboxId,
    createdAt: new Date(row.createdAt).toISOString(),
    expiresAt: new Date(row.expiresAt).toISOString(),
  };
}
