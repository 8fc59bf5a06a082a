import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { SandboxInfo } from '../../src/wire/index.js';
import { parseSpec } from '../../src/sandbox-spec/index.js';
import { ApiKeyStore, OperationStore, SqliteSandboxRecords, openDatabase, type SqliteDatabase } from '../../src/store/index.js';
import { isSandboxError } from '../../src/errors/index.js';

let dir: string;
let db: SqliteDatabase;
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'capsule-store-'));
  db = openDatabase(dir);
});
afterEach(() => {
  db.close();
  rmSync(dir, { recursive: true, force: true });
});

function info(id: string, tenantId: string, createdAt: string, extra: Partial<SandboxInfo> = {}): SandboxInfo {
  return {
    sandboxId: id.padEnd(20, 'a'),
    tenantId,
    state: 'running',
    backend: 'namespace',
    spec: parseSpec({}),
    metadata: {},
    createdAt,
    expiresAt: createdAt,
    ...extra,
  };
}

describe('sandbox records', () => {
  it('upserts, scopes by tenant and lists live records', () => {
    const records = new SqliteSandboxRecords(db);
    records.upsert(info('a', 't1', '2026-01-01T00:00:00.000Z'));
    records.upsert(info('b', 't2', '2026-01-01T00:00:01.000Z'));
    records.upsert({ ...info('a', 't1', '2026-01-01T00:00:00.000Z'), state: 'killed', endReason: 'killed by request' });
    expect(records.get('t1', 'a'.padEnd(20, 'a'))?.endReason).toBe('killed by request');
    expect(records.get('t2', 'a'.padEnd(20, 'a'))).toBeUndefined();
    expect(records.listLive().map((r) => r.tenantId)).toEqual(['t2']);
    expect(records.countLive('t1')).toBe(0);
    expect(records.countLive('t2')).toBe(1);
  });

  it('filters by state and every metadata pair, and pages with a cursor', () => {
    const records = new SqliteSandboxRecords(db);
    for (let i = 0; i < 7; i++) {
      records.upsert(
        info(`s${i}`, 't', `2026-01-01T00:00:0${i}.000Z`, {
          state: i % 2 === 0 ? 'running' : 'expired',
          metadata: { team: i < 5 ? 'red' : 'blue', 'odd key"\'': `v${i}` },
        }),
      );
    }
    const red = records.page({ tenantId: 't', metadata: { team: 'red' }, states: ['running'] });
    expect(red.sandboxes.map((s) => s.sandboxId.slice(0, 2))).toEqual(['s0', 's2', 's4']);
    expect(records.page({ tenantId: 't', metadata: { team: 'red', 'odd key"\'': 'v2' } }).sandboxes).toHaveLength(1);
    expect(records.page({ tenantId: 'other' }).sandboxes).toHaveLength(0);

    const seen: string[] = [];
    let cursor: string | undefined;
    for (let pages = 0; pages < 10; pages++) {
      const page = records.page({ tenantId: 't', limit: 3, cursor });
      seen.push(...page.sandboxes.map((s) => s.sandboxId.slice(0, 2)));
      if (page.nextCursor === null) break;
      cursor = page.nextCursor;
    }
    expect(seen).toEqual(['s0', 's1', 's2', 's3', 's4', 's5', 's6']);
  });

  it('rejects a cursor it did not issue', () => {
    const records = new SqliteSandboxRecords(db);
    let caught: unknown;
    try {
      records.page({ tenantId: 't', cursor: 'garbage!' });
    } catch (error) {
      caught = error;
    }
    expect(isSandboxError(caught, 'INVALID_ARGUMENT')).toBe(true);
  });
});

describe('api keys', () => {
  it('stores only a hash and verifies in constant time', () => {
    const keys = new ApiKeyStore(db);
    const minted = keys.mint('acme', { name: 'ci' });
    expect(minted.apiKey).toMatch(/^cap_[0-9a-f]{40}$/);
    expect(keys.verify(minted.apiKey)).toMatchObject({ tenantId: 'acme', isAdmin: false });
    expect(keys.verify(minted.apiKey.replace(/.$/, (c) => (c === '0' ? '1' : '0')))).toBeUndefined();
    expect(keys.verify('nope')).toBeUndefined();
    const dump = JSON.stringify(db.prepare('SELECT * FROM api_keys').all());
    expect(dump).not.toContain(minted.apiKey);
  });
});

describe('operations', () => {
  it('claims a key once, replays it, refuses another request with it, and expires it', () => {
    let now = 1_000;
    const operations = new OperationStore(db, () => now);
    expect(operations.begin('t', 'k', 'POST /x 1')).toEqual({ kind: 'started' });
    const conflict = (() => {
      try {
        operations.begin('t', 'k', 'POST /x 1');
      } catch (error) {
        return error;
      }
    })();
    expect(isSandboxError(conflict, 'CONFLICT')).toBe(true);
    expect(operations.get('t', 'k')).toEqual({ key: 'k', status: 'in_progress' });
    operations.complete('t', 'k', { status: 201, body: { a: 1 }, contentType: 'application/json' });
    expect(operations.begin('t', 'k', 'POST /x 1')).toEqual({ kind: 'replay', response: { status: 201, body: { a: 1 }, contentType: 'application/json' } });
    const reused = (() => {
      try {
        operations.begin('t', 'k', 'POST /x 2');
      } catch (error) {
        return error;
      }
    })();
    expect(isSandboxError(reused, 'IDEMPOTENCY_KEY_REUSED')).toBe(true);
    expect(operations.get('other', 'k')).toBeUndefined();
    now += 24 * 3_600_000;
    expect(operations.get('t', 'k')).toBeUndefined();
    expect(operations.begin('t', 'k', 'POST /x 2')).toEqual({ kind: 'started' });
  });

  it('settles operations a crash interrupted as outcome unknown', () => {
    const operations = new OperationStore(db);
    operations.begin('t', 'k', 'f');
    expect(operations.settleInterrupted('x')).toBe(1);
    expect(operations.get('t', 'k')).toMatchObject({ status: 'completed', response: { status: 500, body: { code: 'INTERNAL' } } });
  });
});
