import { createHash, createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import type { FastifyRequest } from 'fastify';
import { SandboxError } from '../../errors/index.js';
import type { ApiKeyStore } from '../../store/index.js';
import { principalOf, type Principal } from '../auth.js';
import { ConnectError } from './connect-protocol.js';

/** `e2b_` and 40 hex digits: the same secret as the Capsule key `cap_<same hex>`. */
const E2B_KEY = /^e2b_([0-9a-f]{40})$/;

/**
 * Whether a control-plane call comes from an E2B client: E2B's SDKs always send
 * `X-API-KEY: e2b_…` (they refuse to run without a key). Only such calls get E2B's error shape;
 * anything else that reaches these paths is answered in Capsule's.
 */
export function isE2bCaller(request: FastifyRequest): boolean {
  const header = request.headers['x-api-key'];
  return typeof header === 'string' && header.trim().startsWith('e2b_');
}

/**
 * The tenant of a control-plane call. E2B's SDK sends `X-API-KEY: e2b_<hex>`; Capsule keys are
 * `cap_<hex>`, so an E2B key is a Capsule key under E2B's prefix (the store is unchanged, and a
 * tenant's E2B key is minted with `POST /v1/keys` like any other).
 */
export function e2bPrincipal(request: FastifyRequest, keys: ApiKeyStore): Principal {
  const header = request.headers['x-api-key'];
  const match = E2B_KEY.exec(typeof header === 'string' ? header.trim() : '');
  if (!match) {
    throw new SandboxError('UNAUTHENTICATED', 'the E2B API takes an E2B key in X-API-KEY', {
      hint: 'Set E2B_API_KEY to e2b_ followed by the 40 hex digits of a Capsule key (cap_<hex> → e2b_<hex>).',
    });
  }
  const record = keys.verify(`cap_${match[1]}`);
  if (!record) {
    throw new SandboxError('UNAUTHENTICATED', 'the API key is not valid', {
      hint: 'Use e2b_ followed by the 40 hex digits of a Capsule key (cap_<hex> → e2b_<hex>).',
    });
  }
  return principalOf(record);
}

export interface SandboxAccess {
  tenantId: string;
  sandboxId: string;
}

/** The key id audit records carry for data-plane calls, which authenticate with an access token. */
export const ENVD_TOKEN_KEY_ID = 'e2b-access-token';

/** A principal good for the one sandbox of an envd access token (the seam's `Authenticate`). */
export function envdPrincipal(access: SandboxAccess): Principal & SandboxAccess {
  return { tenantId: access.tenantId, sandboxId: access.sandboxId, keyId: ENVD_TOKEN_KEY_ID, isAdmin: false, grants: { mountRoots: [] } };
}

/** The query of an envd `/files` call, signed or not. */
export interface SignedQuery {
  path?: string;
  username?: string;
  signature?: string;
  signature_expiration?: string;
}

/**
 * envd access tokens (`envdAccessToken`, sent back as `X-Access-Token`): `<tenant>.<hmac>` over
 * the tenant and sandbox id. They carry the tenant so data-plane calls need no lookup. `capsule
 * serve` keys them with the instance's token key (`<dataDir>/keys/tokens.key`), so they stay
 * valid across restarts for as long as the sandbox lives; without a key (tests) they die with
 * this object.
 */
export class EnvdTokens {
  private readonly secret: Buffer;

  constructor(secret?: Buffer) {
    this.secret = secret ?? randomBytes(32);
  }

  issue(tenantId: string, sandboxId: string): string {
    return `${tenantId}.${this.mac(tenantId, sandboxId)}`;
  }

  /** The caller's sandbox, from the `E2b-Sandbox-Id` header and a token valid for it. */
  verify(request: FastifyRequest): SandboxAccess {
    const sandboxId = request.headers['e2b-sandbox-id'];
    if (typeof sandboxId !== 'string' || sandboxId === '') {
      throw new ConnectError('invalid_argument', 'the E2b-Sandbox-Id header is missing; set sandboxUrl and use the SDK, which sends it');
    }
    const tenantId = this.tenantOf(this.tokenOf(request), sandboxId);
    if (tenantId !== undefined) return { tenantId, sandboxId };
    throw new ConnectError('unauthenticated', `no valid access token for sandbox ${sandboxId}; call Sandbox.connect(sandboxId) to get a fresh one`);
  }

  /** The tenant `token` was issued to for `sandboxId`, or undefined when it is not such a token. */
  tenantOf(token: string | undefined, sandboxId: string): string | undefined {
    const dot = token?.lastIndexOf('.') ?? -1;
    if (token === undefined || dot <= 0) return undefined;
    const tenantId = token.slice(0, dot);
    const expected = Buffer.from(this.mac(tenantId, sandboxId));
    const given = Buffer.from(token.slice(dot + 1));
    return given.length === expected.length && timingSafeEqual(given, expected) ? tenantId : undefined;
  }

  /**
   * The sandbox a signed file URL (`sandbox.uploadUrl()` / `downloadUrl()`) was made for. The
   * signature is `v1_` + base64(sha256("path:operation:user:token[:expiration]")), so only a
   * holder of the sandbox's token can make one; the URL names no sandbox, so the candidates
   * (the live sandboxes, or the one in `E2b-Sandbox-Id`) are tried in turn.
   */
  verifySignature(query: SignedQuery, operation: 'read' | 'write', candidates: SandboxAccess[], nowMs = Date.now()): SandboxAccess {
    const expiration = query.signature_expiration;
    if (expiration !== undefined && !(Number(expiration) * 1000 > nowMs)) {
      throw new ConnectError('unauthenticated', 'the signed URL has expired; make a new one with uploadUrl()/downloadUrl()');
    }
    const given = Buffer.from(query.signature ?? '');
    for (const candidate of candidates) {
      const token = this.issue(candidate.tenantId, candidate.sandboxId);
      const raw = [query.path ?? '', operation, query.username ?? '', token, ...(expiration !== undefined ? [expiration] : [])].join(':');
      const expected = Buffer.from(`v1_${createHash('sha256').update(raw).digest('base64').replace(/=+$/, '')}`);
      if (given.length === expected.length && timingSafeEqual(given, expected)) return candidate;
    }
    throw new ConnectError('unauthenticated', `the ${operation} signature does not match any live sandbox's access token for this path`);
  }

  private tokenOf(request: FastifyRequest): string | undefined {
    for (const name of ['x-access-token', 'e2b-traffic-access-token']) {
      const value = request.headers[name];
      if (typeof value === 'string' && value !== '') return value;
    }
    return undefined;
  }

  private mac(tenantId: string, sandboxId: string): string {
    return createHmac('sha256', this.secret).update(`${tenantId}\0${sandboxId}`).digest('base64url');
  }
}

/** The sandbox an envd principal is good for. */
export function sandboxOf(principal: Principal): SandboxAccess {
  if (principal.sandboxId === undefined) throw new ConnectError('unauthenticated', 'this call needs a sandbox access token');
  return { tenantId: principal.tenantId, sandboxId: principal.sandboxId };
}
