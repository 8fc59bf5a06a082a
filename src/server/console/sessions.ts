import { createHash, randomBytes } from 'node:crypto';
import type { ApiKeyRecord } from '../../store/index.js';

/** Browser-session keys: `cses_` and 40 hex digits (160 random bits), never stored in clear. */
export const SESSION_KEY_PATTERN = /^cses_[0-9a-f]{40}$/;
/** One-time console login tokens: `clt_` and 40 hex digits. */
export const LOGIN_TOKEN_PATTERN = /^clt_[0-9a-f]{40}$/;

export interface SessionOptions {
  /** How long a session key works. @default 8 hours */
  sessionTtlMs?: number;
  /** How long a login token can be exchanged. @default 15 minutes */
  loginTokenTtlMs?: number;
  /** Sessions kept at once; the oldest goes first (the server's memory stays bounded). @default 1000 */
  maxSessions?: number;
  now?: () => number;
}

interface Entry {
  record: ApiKeyRecord;
  expiresAtMs: number;
}

export interface Session {
  sessionKey: string;
  expiresAt: string;
  record: ApiKeyRecord;
}

const hash = (secret: string): string => createHash('sha256').update(secret).digest('hex');

/**
 * Short-lived keys for the web console, in memory only: a session key acts as the API key it was
 * made from (same tenant, key id and grants) until it expires, is revoked, or the server stops.
 * A login token is a one-time ticket `capsule serve` prints inside the console URL; exchanging it
 * gives a session of the operator's key, so the long-lived key never goes into a URL.
 */
export class ConsoleSessions {
  private readonly sessions = new Map<string, Entry>();
  private readonly loginTokens = new Map<string, Entry>();
  private readonly sessionTtlMs: number;
  private readonly loginTokenTtlMs: number;
  private readonly maxSessions: number;
  private readonly now: () => number;

  constructor(options: SessionOptions = {}) {
    this.sessionTtlMs = options.sessionTtlMs ?? 8 * 3_600_000;
    this.loginTokenTtlMs = options.loginTokenTtlMs ?? 15 * 60_000;
    this.maxSessions = options.maxSessions ?? 1000;
    this.now = options.now ?? Date.now;
  }

  /** A one-time login token for `record` (the operator's key), valid for `loginTokenTtlMs`. */
  mintLoginToken(record: ApiKeyRecord): { token: string; expiresAt: string } {
    this.sweep(this.loginTokens);
    const token = `clt_${randomBytes(20).toString('hex')}`;
    const expiresAtMs = this.now() + this.loginTokenTtlMs;
    this.loginTokens.set(hash(token), { record, expiresAtMs });
    return { token, expiresAt: new Date(expiresAtMs).toISOString() };
  }

  /** The key a login token stands for, once: the token is gone whatever happens next. */
  redeemLoginToken(token: string): ApiKeyRecord | undefined {
    if (!LOGIN_TOKEN_PATTERN.test(token)) return undefined;
    const key = hash(token);
    const entry = this.loginTokens.get(key);
    this.loginTokens.delete(key);
    return entry && entry.expiresAtMs > this.now() ? entry.record : undefined;
  }

  /** A new session acting as `record`. */
  create(record: ApiKeyRecord): Session {
    this.sweep(this.sessions);
    while (this.sessions.size >= this.maxSessions) {
      const oldest = this.sessions.keys().next().value;
      if (oldest === undefined) break;
      this.sessions.delete(oldest);
    }
    const sessionKey = `cses_${randomBytes(20).toString('hex')}`;
    const expiresAtMs = this.now() + this.sessionTtlMs;
    this.sessions.set(hash(sessionKey), { record, expiresAtMs });
    return { sessionKey, expiresAt: new Date(expiresAtMs).toISOString(), record };
  }

  /** The key record a live session acts as, or undefined. */
  verify(sessionKey: string): ApiKeyRecord | undefined {
    return this.entry(sessionKey)?.record;
  }

  /** When a live session ends, or undefined when it is not one. */
  expiresAt(sessionKey: string): string | undefined {
    const entry = this.entry(sessionKey);
    return entry ? new Date(entry.expiresAtMs).toISOString() : undefined;
  }

  /** Ends a session at once; true when there was one. */
  revoke(sessionKey: string): boolean {
    return SESSION_KEY_PATTERN.test(sessionKey) && this.sessions.delete(hash(sessionKey));
  }

  private entry(sessionKey: string): Entry | undefined {
    if (!SESSION_KEY_PATTERN.test(sessionKey)) return undefined;
    const key = hash(sessionKey);
    const entry = this.sessions.get(key);
    if (entry && entry.expiresAtMs <= this.now()) {
      this.sessions.delete(key);
      return undefined;
    }
    return entry;
  }

  private sweep(entries: Map<string, Entry>): void {
    const now = this.now();
    for (const [key, entry] of entries) if (entry.expiresAtMs <= now) entries.delete(key);
  }
}
