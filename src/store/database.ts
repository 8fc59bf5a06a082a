import { chmodSync, closeSync, existsSync, mkdirSync, openSync } from 'node:fs';
import { join } from 'node:path';
import Database from 'better-sqlite3';

export type SqliteDatabase = Database.Database;

/** File name of the server's state database inside the data directory. */
export const DATABASE_FILE = 'capsule.db';

/**
 * Schema migrations, applied in order once each. A shipped migration never changes; a new
 * change is a new entry. `user_version` records how many ran.
 */
const MIGRATIONS: string[] = [
  `CREATE TABLE sandboxes (
     sandbox_id TEXT PRIMARY KEY,
     tenant_id  TEXT NOT NULL,
     state      TEXT NOT NULL,
     created_at TEXT NOT NULL,
     metadata   TEXT NOT NULL,
     info       TEXT NOT NULL
   );
   CREATE INDEX sandboxes_tenant_created ON sandboxes (tenant_id, created_at, sandbox_id);
   CREATE INDEX sandboxes_state ON sandboxes (state);

   CREATE TABLE api_keys (
     key_id     TEXT PRIMARY KEY,
     tenant_id  TEXT NOT NULL,
     name       TEXT,
     key_hash   TEXT NOT NULL UNIQUE,
     is_admin   INTEGER NOT NULL,
     created_at TEXT NOT NULL
   );

   CREATE TABLE operations (
     tenant_id       TEXT NOT NULL,
     key             TEXT NOT NULL,
     fingerprint     TEXT NOT NULL,
     status          TEXT NOT NULL CHECK (status IN ('in_progress', 'completed')),
     response_status INTEGER,
     response_body   TEXT,
     content_type    TEXT,
     created_at      INTEGER NOT NULL,
     expires_at      INTEGER NOT NULL,
     PRIMARY KEY (tenant_id, key)
   );
   CREATE INDEX operations_expires ON operations (expires_at);

   CREATE TABLE audit (
     seq            INTEGER PRIMARY KEY,
     at             TEXT NOT NULL,
     tenant_id      TEXT NOT NULL,
     key_id         TEXT,
     operation      TEXT NOT NULL,
     phase          TEXT NOT NULL,
     attempt_seq    INTEGER,
     request_id     TEXT,
     sandbox_id     TEXT,
     subject_sha256 TEXT,
     policy         TEXT,
     outcome        TEXT,
     prev_hash      TEXT NOT NULL,
     hash           TEXT NOT NULL
   );`,
  // What the operator granted each key: mount roots by name, and a disk quota override.
  `ALTER TABLE api_keys ADD COLUMN grants TEXT NOT NULL DEFAULT '{"mountRoots":[]}';`,
  // Snapshots of sandboxes (their data: <dataDir>/volume/snapshots/<id>), per tenant.
  `CREATE TABLE snapshots (
     snapshot_id TEXT PRIMARY KEY,
     tenant_id   TEXT NOT NULL,
     created_at  TEXT NOT NULL,
     info        TEXT NOT NULL
   );
   CREATE INDEX snapshots_tenant_created ON snapshots (tenant_id, created_at, snapshot_id);`,
  // Named volumes per tenant (their data: <dataDir>/volume/volumes/<id>).
  `CREATE TABLE volumes (
     volume_id  TEXT PRIMARY KEY,
     tenant_id  TEXT NOT NULL,
     name       TEXT NOT NULL,
     created_at TEXT NOT NULL,
     info       TEXT NOT NULL,
     UNIQUE (tenant_id, name)
   );`,
];

export interface OpenDatabaseOptions {
  /** Open without creating or migrating (for offline checks such as `capsule audit verify`). */
  readOnly?: boolean;
}

/** Opens (and migrates) the state database under `dataDir`. */
export function openDatabase(dataDir: string, options: OpenDatabaseOptions = {}): SqliteDatabase {
  const file = join(dataDir, DATABASE_FILE);
  if (options.readOnly) return new Database(file, { readonly: true, fileMustExist: true });
  mkdirSync(dataDir, { recursive: true, mode: 0o700 });
  // Root's alone: it holds every tenant's spec env and key hashes. SQLite gives the -wal and
  // -shm files the database's own mode; an older Capsule's 0644 files are closed here too.
  closeSync(openSync(file, 'a', 0o600));
  for (const suffix of ['', '-wal', '-shm']) if (existsSync(`${file}${suffix}`)) chmodSync(`${file}${suffix}`, 0o600);
  const db = new Database(file);
  db.pragma('journal_mode = WAL');
  // WAL + NORMAL: every commit survives a crash of the server process (SIGKILL, OOM) and the
  // database is never corrupted; only a power loss or kernel crash can take the last commits. FULL
  // adds an fsync per commit (~6 ms each, several per mutating call): set CAPSULE_DB_SYNC=FULL
  // when records must survive a power loss too. See docs/decisions/002-audit-chain.md.
  db.pragma(`synchronous = ${process.env.CAPSULE_DB_SYNC === 'FULL' ? 'FULL' : 'NORMAL'}`);
  db.pragma('busy_timeout = 5000');
  migrate(db);
  return db;
}

function migrate(db: SqliteDatabase): void {
  const version = db.pragma('user_version', { simple: true }) as number;
  for (let i = version; i < MIGRATIONS.length; i++) {
    db.transaction(() => {
      db.exec(MIGRATIONS[i]!);
      db.pragma(`user_version = ${i + 1}`);
    })();
  }
}

/**
 * Runs functions in one IMMEDIATE transaction each, so that the writes of one call commit (or
 * roll back) together; a store's own transaction inside joins it as a savepoint.
 */
export function atomically(db: SqliteDatabase): <T>(fn: () => T) => T {
  const run = db.transaction((fn: () => unknown) => fn());
  return <T>(fn: () => T): T => run.immediate(fn) as T;
}
