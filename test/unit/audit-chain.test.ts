import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { AuditLog, GENESIS_HASH, canonicalJson, openDatabase, recordHash, verifyAuditChain, type SqliteDatabase } from '../../src/store/index.js';

let dir: string;
let db: SqliteDatabase;
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'capsule-audit-'));
  db = openDatabase(dir);
});
afterEach(() => {
  db.close();
  rmSync(dir, { recursive: true, force: true });
});

function fill(log: AuditLog, n: number): void {
  for (let i = 0; i < n; i++) {
    log.append({ tenantId: 't', keyId: 'key_1', operation: 'sandboxes.create', phase: 'attempt', policy: i === 1 ? { network: { mode: 'internet' } } : null });
  }
}

describe('canonical JSON', () => {
  it('sorts keys at every level and drops undefined', () => {
    expect(canonicalJson({ b: 1, a: { d: [1, { z: 1, y: null }], c: undefined } })).toBe('{"a":{"d":[1,{"y":null,"z":1}]},"b":1}');
  });
});

describe('audit chain', () => {
  it('links each record to the one before it', () => {
    const log = new AuditLog(db);
    fill(log, 3);
    const records = log.list();
    expect(records.map((r) => r.seq)).toEqual([1, 2, 3]);
    expect(records[0]?.prevHash).toBe(GENESIS_HASH);
    expect(records[1]?.prevHash).toBe(records[0]?.hash);
    const { hash, ...rest } = records[2]!;
    expect(recordHash(rest)).toBe(hash);
    expect(verifyAuditChain(db)).toEqual({ ok: true, records: 3, headHash: records[2]?.hash });
  });

  it('names the first record that was edited', () => {
    fill(new AuditLog(db), 4);
    db.prepare("UPDATE audit SET outcome = 'ok' WHERE seq = 3").run();
    expect(verifyAuditChain(db)).toMatchObject({ ok: false, badSeq: 3 });
  });

  it('detects a removed record, even with the link rewritten', () => {
    fill(new AuditLog(db), 4);
    const second = db.prepare('SELECT prev_hash FROM audit WHERE seq = 2').get() as { prev_hash: string };
    db.prepare('DELETE FROM audit WHERE seq = 2').run();
    db.prepare('UPDATE audit SET prev_hash = ? WHERE seq = 3').run(second.prev_hash);
    expect(verifyAuditChain(db)).toMatchObject({ ok: false, badSeq: 3 });
  });

  it('detects a forged policy on a middle record', () => {
    fill(new AuditLog(db), 3);
    db.prepare('UPDATE audit SET policy = NULL WHERE seq = 2').run();
    expect(verifyAuditChain(db)).toMatchObject({ ok: false, badSeq: 2 });
  });
});
