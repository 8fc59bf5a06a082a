import { SandboxError } from '../errors/index.js';
import type { SqliteDatabase } from './database.js';

/** How long a key is remembered. */
export const OPERATION_TTL_MS = 24 * 3_600_000;

export interface StoredResponse {
  status: number;
  /** The JSON body (for a stream, its final event). */
  body: unknown;
  contentType: string;
}

export interface OperationRecord {
  key: string;
  status: 'in_progress' | 'completed';
  response?: { status: number; body: unknown };
}

export type BeginResult = { kind: 'started' } | { kind: 'replay'; response: StoredResponse };

interface Row {
  key: string;
  fingerprint: string;
  status: 'in_progress' | 'completed';
  response_status: number | null;
  response_body: string | null;
  content_type: string | null;
}

/**
 * Idempotent operations: the first call with a key runs and its response is kept for 24 h; a
 * retry with the same key and request gets that response back instead of running again.
 */
export class OperationStore {
  // Prepared once: every POST with a key runs these, and preparing costs more than running.
  private readonly statements;
  private readonly beginTransaction: (tenantId: string, key: string, fingerprint: string) => BeginResult;

  constructor(
    private readonly db: SqliteDatabase,
    private readonly now: () => number = Date.now,
  ) {
    this.statements = {
      sweep: db.prepare<[number]>('DELETE FROM operations WHERE expires_at <= ?'),
      find: db.prepare<[string, string], Row>('SELECT * FROM operations WHERE tenant_id = ? AND key = ?'),
      claim: db.prepare<[string, string, string, number, number]>(
        "INSERT INTO operations (tenant_id, key, fingerprint, status, created_at, expires_at) VALUES (?, ?, ?, 'in_progress', ?, ?)",
      ),
      complete: db.prepare<[number, string, string, string, string]>(
        "UPDATE operations SET status = 'completed', response_status = ?, response_body = ?, content_type = ? WHERE tenant_id = ? AND key = ? AND status = 'in_progress'",
      ),
      release: db.prepare<[string, string]>("DELETE FROM operations WHERE tenant_id = ? AND key = ? AND status = 'in_progress'"),
      get: db.prepare<[string, string, number], Row>('SELECT * FROM operations WHERE tenant_id = ? AND key = ? AND expires_at > ?'),
    };
    this.beginTransaction = db.transaction((tenantId: string, key: string, fingerprint: string) => this.claim(tenantId, key, fingerprint));
  }

  /**
   * Claims `key` for this request, or returns the stored response of the first one. Runs in one
   * synchronous SQLite transaction, so two concurrent requests cannot both claim it.
   */
  begin(tenantId: string, key: string, fingerprint: string): BeginResult {
    return this.beginTransaction(tenantId, key, fingerprint);
  }

  private claim(tenantId: string, key: string, fingerprint: string): BeginResult {
    const now = this.now();
    this.statements.sweep.run(now);
    const row = this.statements.find.get(tenantId, key);
    if (!row) {
      this.statements.claim.run(tenantId, key, fingerprint, now, now + OPERATION_TTL_MS);
      return { kind: 'started' };
    }
    if (row.fingerprint !== fingerprint) {
      throw new SandboxError('IDEMPOTENCY_KEY_REUSED', `Idempotency-Key "${key}" was already used for a different request`, {
        details: { idempotencyKey: key },
        hint: 'Use a new key for a new request; reuse a key only to retry the identical request.',
      });
    }
    if (row.status === 'in_progress') {
      throw new SandboxError('CONFLICT', `the request with Idempotency-Key "${key}" is still in progress`, {
        details: { idempotencyKey: key },
        hint: `Poll GET /v1/operations/${encodeURIComponent(key)} until it is completed; it then holds the response.`,
      });
    }
    return {
      kind: 'replay',
      response: {
        status: row.response_status ?? 500,
        body: row.response_body === null ? null : JSON.parse(row.response_body),
        contentType: row.content_type ?? 'application/json',
      },
    };
  }

  /** Stores the response of a claimed key; a key already completed keeps its first response. */
  complete(tenantId: string, key: string, response: StoredResponse): void {
    this.statements.complete.run(response.status, JSON.stringify(response.body ?? null), response.contentType, tenantId, key);
  }

  /** Forgets a claimed key whose request did not take effect, so a retry runs again. */
  release(tenantId: string, key: string): void {
    this.statements.release.run(tenantId, key);
  }

  get(tenantId: string, key: string): OperationRecord | undefined {
    const row = this.statements.get.get(tenantId, key, this.now());
    if (!row) return undefined;
    const record: OperationRecord = { key: row.key, status: row.status };
    if (row.status === 'completed') {
      record.response = { status: row.response_status ?? 500, body: row.response_body === null ? null : JSON.parse(row.response_body) };
    }
    return record;
  }

  /**
   * At start-up: operations still in progress belonged to a server that died. Their outcome is
   * unknown, so they complete with an error saying so (a blind re-run could do the work twice).
   */
  settleInterrupted(requestIdPrefix: string): number {
    const body = {
      code: 'INTERNAL',
      message: 'the server stopped while this operation was in progress; its outcome is unknown',
      hint: 'Check the resource (e.g. list sandboxes by metadata) before retrying with a new Idempotency-Key.',
      requestId: `${requestIdPrefix}-restart`,
    };
    return this.db
      .prepare(
        "UPDATE operations SET status = 'completed', response_status = 500, response_body = ?, content_type = 'application/json' WHERE status = 'in_progress'",
      )
      .run(JSON.stringify(body)).changes;
  }
}
