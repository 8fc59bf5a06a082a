import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import { SandboxError } from '../errors/index.js';
import type { SqliteDatabase } from './database.js';

/** `cap_` and 40 hex digits: 160 random bits, so a plain sha256 of the key is a safe verifier. */
export const API_KEY_PATTERN = /^cap_[0-9a-f]{40}$/;
export const TENANT_ID_PATTERN = /^[a-z0-9][a-z0-9_-]{0,63}$/;
export const DEFAULT_TENANT = 'default';

/**
 * What the operator granted a key, beyond its tenant's own sandboxes. Stored as JSON; an admin
 * key may use every mount root whatever its list says.
 */
export interface KeyGrants {
  /** Names of the operator's mount roots (`serve --mount-root NAME=PATH`) the key may mount. */
  mountRoots: string[];
  /** The tenant's disk quota for work made with this key, overriding the operator's default. */
  diskQuotaBytes?: number;
}

export interface ApiKeyRecord {
  keyId: string;
  tenantId: string;
  name: string | null;
  isAdmin: boolean;
  createdAt: string;
  grants: KeyGrants;
}

export interface MintedKey extends ApiKeyRecord {
  /** The secret; shown once, stored only as its hash. */
  apiKey: string;
}

interface Row {
  key_id: string;
  tenant_id: string;
  name: string | null;
  key_hash: string;
  is_admin: number;
  created_at: string;
  grants: string;
}

/** A stored grants column, read defensively: anything unreadable grants nothing. */
function parseGrants(text: string): KeyGrants {
  try {
    const value = JSON.parse(text) as Partial<KeyGrants>;
    const mountRoots = Array.isArray(value.mountRoots) ? value.mountRoots.filter((r): r is string => typeof r === 'string') : [];
    return typeof value.diskQuotaBytes === 'number' ? { mountRoots, diskQuotaBytes: value.diskQuotaBytes } : { mountRoots };
  } catch {
    return { mountRoots: [] };
  }
}

function recordOf(row: Row): ApiKeyRecord {
  return { keyId: row.key_id, tenantId: row.tenant_id, name: row.name, isAdmin: row.is_admin === 1, createdAt: row.created_at, grants: parseGrants(row.grants) };
}

export function newApiKey(): string {
  return `cap_${randomBytes(20).toString('hex')}`;
}

function hashKey(apiKey: string): string {
  return createHash('sha256').update(apiKey).digest('hex');
}

/** API keys, stored hashed, each bound to one tenant. */
export class ApiKeyStore {
  // Prepared once: every authenticated request looks its key up.
  private readonly byHash;

  constructor(
    private readonly db: SqliteDatabase,
    private readonly now: () => number = Date.now,
  ) {
    this.byHash = db.prepare<[string], Row>('SELECT * FROM api_keys WHERE key_hash = ?');
  }

  /** Creates a key for `tenantId` and returns it with its secret (the only time it is visible). */
  mint(tenantId: string, options: { name?: string; isAdmin?: boolean; apiKey?: string; grants?: KeyGrants } = {}): MintedKey {
    if (!TENANT_ID_PATTERN.test(tenantId)) {
      throw new SandboxError('INVALID_ARGUMENT', `tenantId "${tenantId}" is not a valid tenant id`, {
        details: { field: 'tenantId' },
        hint: 'Use 1-64 lowercase letters, digits, "_" or "-", starting with a letter or digit.',
      });
    }
    const apiKey = options.apiKey ?? newApiKey();
    const record: ApiKeyRecord = {
      keyId: `key_${randomBytes(8).toString('hex')}`,
      tenantId,
      name: options.name ?? null,
      isAdmin: options.isAdmin ?? false,
      createdAt: new Date(this.now()).toISOString(),
      grants: { mountRoots: [...new Set(options.grants?.mountRoots ?? [])], ...(options.grants?.diskQuotaBytes !== undefined ? { diskQuotaBytes: options.grants.diskQuotaBytes } : {}) },
    };
    this.db
      .prepare('INSERT INTO api_keys (key_id, tenant_id, name, key_hash, is_admin, created_at, grants) VALUES (?, ?, ?, ?, ?, ?, ?)')
      .run(record.keyId, tenantId, record.name, hashKey(apiKey), record.isAdmin ? 1 : 0, record.createdAt, JSON.stringify(record.grants));
    return { ...record, apiKey };
  }

  /**
   * Ensures the operator's bootstrap key exists (admin of the default tenant). Returns the stored
   * record and whether it was created now.
   */
  ensureAdminKey(apiKey: string, name: string): { record: ApiKeyRecord; created: boolean } {
    const existing = this.verify(apiKey);
    if (existing) return { record: existing, created: false };
    const minted = this.mint(DEFAULT_TENANT, { name, isAdmin: true, apiKey });
    const { apiKey: _secret, ...record } = minted;
    return { record, created: true };
  }

  /** The first admin key of the default tenant (the operator's bootstrap key), if any. */
  operatorKey(): ApiKeyRecord | undefined {
    const row = this.db
      .prepare<[string], Row>('SELECT * FROM api_keys WHERE is_admin = 1 AND tenant_id = ? ORDER BY created_at, key_id LIMIT 1')
      .get(DEFAULT_TENANT);
    return row ? recordOf(row) : undefined;
  }

  hasAdminKey(): boolean {
    return this.db.prepare('SELECT 1 FROM api_keys WHERE is_admin = 1 LIMIT 1').get() !== undefined;
  }

  /**
   * The key's record, or undefined. The lookup is by sha256 of the key (an index lookup leaks
   * at most timing about a hash, not about the key); the stored hash is then compared in
   * constant time.
   */
  verify(apiKey: string): ApiKeyRecord | undefined {
    if (!API_KEY_PATTERN.test(apiKey)) return undefined;
    const hash = hashKey(apiKey);
    const row = this.byHash.get(hash);
    if (!row || !timingSafeEqual(Buffer.from(row.key_hash, 'hex'), Buffer.from(hash, 'hex'))) return undefined;
    return recordOf(row);
  }
}
