import type { IncomingHttpHeaders } from 'node:http';
import { SandboxError } from '../errors/index.js';
import type { ApiKeyRecord, KeyGrants } from '../store/index.js';
import { TENANT_ID_PATTERN } from '../wire/index.js';

/** Who is calling: the tenant every lookup is scoped to, and the key (for the audit log). */
export interface Principal {
  tenantId: string;
  keyId: string;
  isAdmin: boolean;
  /** Set when the credential is good for one sandbox only (an E2B envd access token). */
  sandboxId?: string;
  /** What the operator granted the key (mount roots, disk quota); an admin key may mount every root. */
  grants: KeyGrants;
}

/** The principal of a verified key (also the E2B facade's, which reads keys its own way). */
export function principalOf(record: ApiKeyRecord): Principal {
  return { tenantId: record.tenantId, keyId: record.keyId, isAdmin: record.isAdmin, grants: record.grants };
}

/** The mount roots a principal may name in a spec: its grants, or every root for the operator's key. */
export function mountGrantOf(principal: Principal): readonly string[] | 'all' {
  return principal.isAdmin ? 'all' : principal.grants.mountRoots;
}

export type AuthLevel = 'none' | 'tenant' | 'admin';

/** Looks a presented key up: the stored API keys, or the console's session keys. */
export interface KeyVerifier {
  verify(apiKey: string): ApiKeyRecord | undefined;
}

/**
 * The header with which an operator's (admin) key acts in another tenant: every lookup of the
 * call is scoped to that tenant, and the audit log records the operator's key id with it.
 */
export const ACT_AS_TENANT_HEADER = 'x-capsule-tenant';

/** The API key a request presents (Authorization: Bearer, or X-API-Key), unverified. */
export function presentedKey(request: { headers: IncomingHttpHeaders }): string | undefined {
  const header = request.headers.authorization;
  if (typeof header === 'string') {
    const match = /^Bearer\s+(\S+)\s*$/i.exec(header);
    return match?.[1] ?? '';
  }
  const apiKey = request.headers['x-api-key'];
  return typeof apiKey === 'string' ? apiKey.trim() : undefined;
}

/** Checks the request's API key; throws UNAUTHENTICATED or PERMISSION_DENIED. */
export function authenticate(request: { headers: IncomingHttpHeaders }, keys: KeyVerifier, level: Exclude<AuthLevel, 'none'>, sessions?: KeyVerifier): Principal {
  const apiKey = presentedKey(request);
  if (apiKey === undefined) {
    throw new SandboxError('UNAUTHENTICATED', 'no API key was sent', {
      hint: 'Send Authorization: Bearer <apiKey> (or X-API-Key: <apiKey>); capsule serve prints the first key at start-up.',
    });
  }
  const record = keys.verify(apiKey) ?? sessions?.verify(apiKey);
  if (!record) {
    throw new SandboxError('UNAUTHENTICATED', 'the API key is not valid', {
      hint: 'Check the key (format cap_ and 40 hex digits); keys are shown once when minted.',
    });
  }
  if (level === 'admin' && !record.isAdmin) {
    throw new SandboxError('PERMISSION_DENIED', 'this call needs an admin key', {
      hint: 'Use the operator key printed by capsule serve, or one minted with admin: true.',
    });
  }
  return actingTenant(request, principalOf(record));
}

/**
 * An admin key may act in any tenant (it could mint a key of that tenant anyway): with
 * `X-Capsule-Tenant: T` the call sees T's sandboxes. Any other key sending it is refused.
 */
function actingTenant(request: { headers: IncomingHttpHeaders }, principal: Principal): Principal {
  const header = request.headers[ACT_AS_TENANT_HEADER];
  if (header === undefined) return principal;
  if (!principal.isAdmin) {
    throw new SandboxError('PERMISSION_DENIED', `only an admin key may send ${ACT_AS_TENANT_HEADER}`, {
      details: { field: ACT_AS_TENANT_HEADER },
      hint: `Leave the ${ACT_AS_TENANT_HEADER} header out: a tenant key always acts in its own tenant.`,
    });
  }
  if (typeof header !== 'string' || !TENANT_ID_PATTERN.test(header)) {
    throw new SandboxError('INVALID_ARGUMENT', `${ACT_AS_TENANT_HEADER} must be one tenant id`, {
      details: { field: ACT_AS_TENANT_HEADER },
      hint: 'Send 1-64 lowercase letters, digits, "_" or "-", once.',
    });
  }
  return { ...principal, tenantId: header };
}
