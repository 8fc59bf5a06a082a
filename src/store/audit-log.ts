import { createHash } from 'node:crypto';
import type { SqliteDatabase } from './database.js';
import { canonicalJson } from './canonical-json.js';

export const GENESIS_HASH = '0'.repeat(64);

/**
 * `attempt` is written before the work and `outcome` after it (pointing at its attempt);
 * `event` is something the engine did on its own (a TTL expiry, a crash, a recovery).
 */
export type AuditPhase = 'attempt' | 'outcome' | 'event';

export interface AuditEntry {
  tenantId: string;
  /** The API key that made the call; null for the server's own events. */
  keyId: string | null;
  /** Route name, e.g. `sandboxes.create`, or an engine event, e.g. `sandbox.expired`. */
  operation: string;
  phase: AuditPhase;
  attemptSeq?: number | null;
  requestId?: string | null;
  sandboxId?: string | null;
  /** sha256 of what the call acted on: the argv, the file path, the code. Never the thing itself. */
  subjectSha256?: string | null;
  /** Capabilities the call opened (network mode other than none, mounts, handles). */
  policy?: Record<string, unknown> | null;
  /** `ok`, an error code, or `limit:<resource>`. */
  outcome?: string | null;
}

/** A stored record: the entry, its place in the chain and its hash. */
export interface AuditRecord {
  seq: number;
  at: string;
  tenantId: string;
  keyId: string | null;
  operation: string;
  phase: AuditPhase;
  attemptSeq: number | null;
  requestId: string | null;
  sandboxId: string | null;
  subjectSha256: string | null;
  /** Canonical JSON of the policy, as hashed. */
  policy: string | null;
  outcome: string | null;
  prevHash: string;
  hash: string;
}

interface Row {
  seq: number;
  at: string;
  tenant_id: string;
  key_id: string | null;
  operation: string;
  phase: AuditPhase;
  attempt_seq: number | null;
  request_id: string | null;
  sandbox_id: string | null;
  subject_sha256: string | null;
  policy: string | null;
  outcome: string | null;
  prev_hash: string;
  hash: string;
}

export interface AuditListOptions {
  after?: number;
  before?: number;
  /** @default 100 */
  limit?: number;
  /** @default 'asc' */
  order?: 'asc' | 'desc';
  tenantId?: string;
  sandboxId?: string;
  operation?: string;
  outcome?: string;
}

export type VerifyResult =
  | { ok: true; records: number; headHash: string }
  | { ok: false; records: number; badSeq: number; reason: string };

export function sha256Hex(data: string | Buffer): string {
  return createHash('sha256').update(data).digest('hex');
}

/** hash = sha256(prev_hash + canonical JSON of every field but the hash). */
export function recordHash(record: Omit<AuditRecord, 'hash'>): string {
  return sha256Hex(record.prevHash + canonicalJson(record));
}

function fromRow(row: Row): AuditRecord {
  return {
    seq: row.seq,
    at: row.at,
    tenantId: row.tenant_id,
    keyId: row.key_id,
    operation: row.operation,
    phase: row.phase,
    attemptSeq: row.attempt_seq,
    requestId: row.request_id,
    sandboxId: row.sandbox_id,
    subjectSha256: row.subject_sha256,
    policy: row.policy,
    outcome: row.outcome,
    prevHash: row.prev_hash,
    hash: row.hash,
  };
}

/**
 * The append-only, hash-chained audit log. Each append is one SQLite transaction that reads the
 * head and writes the next record, so the chain never forks; a failed append throws and the
 * caller must not do (or report) the work.
 */
export class AuditLog {
  // Prepared once: every audited call appends twice.
  private readonly headStatement;
  private readonly insertStatement;
  private readonly appendTransaction;

  constructor(
    private readonly db: SqliteDatabase,
    private readonly now: () => number = Date.now,
  ) {
    this.headStatement = db.prepare<[], { seq: number; hash: string }>('SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1');
    this.insertStatement = db.prepare<[AuditRecord]>(
      `INSERT INTO audit (seq, at, tenant_id, key_id, operation, phase, attempt_seq, request_id, sandbox_id,
         subject_sha256, policy, outcome, prev_hash, hash)
       VALUES (@seq, @at, @tenantId, @keyId, @operation, @phase, @attemptSeq, @requestId, @sandboxId,
         @subjectSha256, @policy, @outcome, @prevHash, @hash)`,
    );
    this.appendTransaction = db.transaction((entry: AuditEntry) => this.appendNow(entry));
  }

  append(entry: AuditEntry): AuditRecord {
    return this.appendTransaction.immediate(entry);
  }

  private appendNow(entry: AuditEntry): AuditRecord {
    const head = this.headStatement.get();
    const unhashed: Omit<AuditRecord, 'hash'> = {
      seq: (head?.seq ?? 0) + 1,
      at: new Date(this.now()).toISOString(),
      tenantId: entry.tenantId,
      keyId: entry.keyId,
      operation: entry.operation,
      phase: entry.phase,
      attemptSeq: entry.attemptSeq ?? null,
      requestId: entry.requestId ?? null,
      sandboxId: entry.sandboxId ?? null,
      subjectSha256: entry.subjectSha256 ?? null,
      policy: entry.policy ? canonicalJson(entry.policy) : null,
      outcome: entry.outcome ?? null,
      prevHash: head?.hash ?? GENESIS_HASH,
    };
    const record: AuditRecord = { ...unhashed, hash: recordHash(unhashed) };
    this.insertStatement.run(record);
    return record;
  }

  /** Records after `after` and before `before` (seqs) that match every filter given, oldest first unless `order` is desc. */
  list(options: AuditListOptions = {}): AuditRecord[] {
    const where = ['seq > ?'];
    const args: (string | number)[] = [options.after ?? 0];
    if (options.before !== undefined) {
      where.push('seq < ?');
      args.push(options.before);
    }
    for (const [column, value] of [['tenant_id', options.tenantId], ['sandbox_id', options.sandboxId], ['operation', options.operation], ['outcome', options.outcome]] as const) {
      if (value === undefined) continue;
      where.push(`${column} = ?`);
      args.push(value);
    }
    return this.db
      .prepare<(string | number)[], Row>(`SELECT * FROM audit WHERE ${where.join(' AND ')} ORDER BY seq ${options.order === 'desc' ? 'DESC' : 'ASC'} LIMIT ?`)
      .all(...args, options.limit ?? 100)
      .map(fromRow);
  }

  /** Recomputes the whole chain (see verifyAuditChain). */
  verify(): VerifyResult {
    return verifyAuditChain(this.db);
  }

  head(): { seq: number; hash: string } {
    return this.headStatement.get() ?? { seq: 0, hash: GENESIS_HASH };
  }
}

/**
 * Recomputes the chain from the first record and names the first record that does not match:
 * an edited field, a deleted or inserted record, or a broken link. (Cutting records off the
 * end leaves a valid shorter chain; compare the head hash with one kept elsewhere to catch it.)
 */
export function verifyAuditChain(db: SqliteDatabase): VerifyResult {
  let prevHash = GENESIS_HASH;
  let expectedSeq = 1;
  let count = 0;
  for (const row of db.prepare<[], Row>('SELECT * FROM audit ORDER BY seq').iterate()) {
    const record = fromRow(row);
    count++;
    if (record.seq !== expectedSeq) {
      return { ok: false, records: count, badSeq: record.seq, reason: `expected record ${expectedSeq} next, found ${record.seq} (a record was removed or inserted)` };
    }
    if (record.prevHash !== prevHash) {
      return { ok: false, records: count, badSeq: record.seq, reason: 'prev_hash does not match the hash of the record before it' };
    }
    const { hash, ...unhashed } = record;
    if (recordHash(unhashed) !== hash) {
      return { ok: false, records: count, badSeq: record.seq, reason: 'the record was changed after it was written (its hash does not match its content)' };
    }
    prevHash = hash;
    expectedSeq++;
  }
  return { ok: true, records: count, headHash: prevHash };
}
