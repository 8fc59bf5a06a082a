import { SandboxError } from '../errors/index.js';
import { LIVE_STATES, type SandboxInfo, type SandboxPage, type SandboxState } from '../wire/index.js';
import type { SandboxRecordStore, UnreadableRecord } from './record-store.js';
import type { SqliteDatabase } from './database.js';

export interface SandboxPageQuery {
  /** The tenant whose sandboxes to list; `null` lists every tenant's (the operator's view). */
  tenantId: string | null;
  states?: readonly SandboxState[];
  /** Exact match on every pair. */
  metadata?: Record<string, string>;
  /** @default 50 */
  limit?: number;
  /** Opaque cursor from the previous page. */
  cursor?: string;
}


interface LiveRow {
  sandbox_id: string;
  tenant_id: string;
  created_at: string;
  metadata: string;
  info: string;
}

/** A stored record, or why it cannot be read (a damaged row must not stop every other recovery). */
function readRecord(text: string): SandboxInfo | string {
  let info: unknown;
  try {
    info = JSON.parse(text);
  } catch (error) {
    return `not JSON (${(error as Error).message})`;
  }
  const record = info as Partial<SandboxInfo> | null;
  if (record === null || typeof record !== 'object' || typeof record.sandboxId !== 'string' || typeof record.state !== 'string' || record.spec === null || typeof record.spec !== 'object') {
    return 'not a sandbox record (sandboxId, state or spec missing)';
  }
  const spec = record.spec as Partial<SandboxInfo['spec']>;
  if (typeof spec.backend !== 'string' || spec.limits === null || typeof spec.limits !== 'object' || spec.network === null || typeof spec.network !== 'object') {
    return 'its spec is incomplete (backend, limits or network missing)';
  }
  return record as SandboxInfo;
}

/**
 * Sandbox records in SQLite: the engine upserts every state change; the server reads them for
 * GET and list, so sandboxes that ended stay queryable with their endReason.
 */
export class SqliteSandboxRecords implements SandboxRecordStore {
  private readonly upsertStatement;
  private readonly getStatement;

  constructor(private readonly db: SqliteDatabase) {
    this.upsertStatement = db.prepare(
      `INSERT INTO sandboxes (sandbox_id, tenant_id, state, created_at, metadata, info)
       VALUES (@sandboxId, @tenantId, @state, @createdAt, @metadata, @info)
       ON CONFLICT (sandbox_id) DO UPDATE SET state = excluded.state, metadata = excluded.metadata, info = excluded.info`,
    );
    this.getStatement = db.prepare<[string, string], { info: string }>(
      'SELECT info FROM sandboxes WHERE tenant_id = ? AND sandbox_id = ?',
    );
  }

  upsert(info: SandboxInfo): void {
    this.upsertStatement.run({
      sandboxId: info.sandboxId,
      tenantId: info.tenantId,
      state: info.state,
      createdAt: info.createdAt,
      metadata: JSON.stringify(info.metadata),
      info: JSON.stringify(info),
    });
  }

  /** Readable live records; an unreadable one is left out (see listUnreadableLive), never fatal. */
  listLive(): SandboxInfo[] {
    return this.liveRows().flatMap((row) => {
      const info = readRecord(row.info);
      return typeof info === 'string' ? [] : [info];
    });
  }

  listUnreadableLive(): UnreadableRecord[] {
    return this.liveRows().flatMap((row) => {
      const error = readRecord(row.info);
      if (typeof error !== 'string') return [];
      const metadata = (() => {
        try {
          const parsed = JSON.parse(row.metadata) as unknown;
          return parsed !== null && typeof parsed === 'object' ? (parsed as Record<string, string>) : {};
        } catch {
          return {};
        }
      })();
      return [{ sandboxId: row.sandbox_id, tenantId: row.tenant_id, createdAt: row.created_at, metadata, error }];
    });
  }

  private liveRows(): LiveRow[] {
    return this.db
      .prepare<string[], LiveRow>(`SELECT sandbox_id, tenant_id, created_at, metadata, info FROM sandboxes WHERE state IN (${LIVE_STATES.map(() => '?').join(', ')})`)
      .all(...LIVE_STATES);
  }

  /**
   * The record of a sandbox whatever its tenant: only for what a URL reaches without naming a
   * tenant (a sandbox's public ports). Everything else goes through `get`.
   */
  findById(sandboxId: string): SandboxInfo | undefined {
    const row = this.db.prepare<[string], { info: string }>('SELECT info FROM sandboxes WHERE sandbox_id = ?').get(sandboxId);
    return row ? (JSON.parse(row.info) as SandboxInfo) : undefined;
  }

  /** The record of a tenant's sandbox; another tenant's id is as missing as an unknown one. */
  get(tenantId: string, sandboxId: string): SandboxInfo | undefined {
    const row = this.getStatement.get(tenantId, sandboxId);
    return row ? (JSON.parse(row.info) as SandboxInfo) : undefined;
  }

  /** Sandboxes in a live state per tenant (the quota counts them). */
  countLive(tenantId: string): number {
    const row = this.db
      .prepare<string[], { n: number }>(
        `SELECT count(*) AS n FROM sandboxes WHERE tenant_id = ? AND state IN (${LIVE_STATES.map(() => '?').join(', ')})`,
      )
      .get(tenantId, ...LIVE_STATES);
    return row?.n ?? 0;
  }

  /** One page, oldest first (sandboxes created meanwhile land on later pages, none is skipped). */
  page(query: SandboxPageQuery): SandboxPage {
    const limit = query.limit ?? 50;
    const where: string[] = [];
    const args: (string | number)[] = [];
    // An explicit null, never a missing value, widens the list to every tenant.
    if (query.tenantId !== null) {
      where.push('tenant_id = ?');
      args.push(query.tenantId);
    }
    if (query.states && query.states.length > 0) {
      where.push(`state IN (${query.states.map(() => '?').join(', ')})`);
      args.push(...query.states);
    }
    for (const [key, value] of Object.entries(query.metadata ?? {})) {
      where.push("EXISTS (SELECT 1 FROM json_each(sandboxes.metadata) WHERE json_each.key = ? AND json_each.type = 'text' AND json_each.value = ?)");
      args.push(key, value);
    }
    if (query.cursor !== undefined) {
      const [createdAt, sandboxId] = decodeCursor(query.cursor);
      where.push('(created_at, sandbox_id) > (?, ?)');
      args.push(createdAt, sandboxId);
    }
    const rows = this.db
      .prepare<(string | number)[], { info: string }>(
        `SELECT info FROM sandboxes ${where.length > 0 ? `WHERE ${where.join(' AND ')}` : ''} ORDER BY created_at, sandbox_id LIMIT ?`,
      )
      .all(...args, limit + 1);
    const sandboxes = rows.slice(0, limit).map((row) => JSON.parse(row.info) as SandboxInfo);
    const last = sandboxes[sandboxes.length - 1];
    const nextCursor = rows.length > limit && last ? encodeCursor(last.createdAt, last.sandboxId) : null;
    return { sandboxes, nextCursor };
  }
}

function encodeCursor(createdAt: string, sandboxId: string): string {
  return Buffer.from(JSON.stringify([createdAt, sandboxId])).toString('base64url');
}

function decodeCursor(cursor: string): [string, string] {
  try {
    const value: unknown = JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8'));
    if (Array.isArray(value) && value.length === 2 && value.every((v) => typeof v === 'string')) {
      return value as [string, string];
    }
  } catch {
    // fall through to the error below
  }
  throw new SandboxError('INVALID_ARGUMENT', 'cursor is not one this server issued', {
    details: { field: 'cursor' },
    hint: 'Pass nextCursor from the previous page unchanged, or leave cursor out for the first page.',
  });
}
