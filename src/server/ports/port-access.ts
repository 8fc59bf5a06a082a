import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';

/** The query parameter of a signed port URL; stripped before the request reaches the sandbox. */
export const PORT_TOKEN_PARAM = 'capsule_token';
/** The cookie a signed URL sets, so the page's own links and scripts keep access. */
export const PORT_TOKEN_COOKIE = 'capsule_port_token';
/** How long `capsule sandbox url` and `POST …/ports/P/url` sign for by default. @default 1 hour */
export const DEFAULT_PORT_URL_TTL_MS = 60 * 60 * 1000;
/** The longest a signed port URL may live. @default 7 days */
export const MAX_PORT_URL_TTL_MS = 7 * 24 * 60 * 60 * 1000;

const SANDBOX_HOST = /^(\d{1,5})-([a-z2-7]{20})$/;

/** What a verified port token grants: one port of one tenant's sandbox, until it expires. */
export interface PortGrant {
  tenantId: string;
  sandboxId: string;
  port: number;
}

export type PortTokenCheck = { ok: true; tenantId: string } | { ok: false; reason: 'malformed' | 'expired' | 'mismatch' };

/**
 * Signed port URLs: `capsule_token=<expiresSec>.<tenantId>.<hmac>` over the tenant, sandbox,
 * port and expiry. The token names one port of one sandbox; a key derived from the instance's
 * token key (`<dataDir>/keys/tokens.key`) signs it, so a restarted server accepts the URLs it
 * made until they expire.
 */
export class PortUrlSigner {
  private readonly secret: Buffer;

  constructor(secret?: Buffer) {
    this.secret = secret ?? randomBytes(32);
  }

  sign(grant: PortGrant, expiresAtMs: number): string {
    const expiresSec = Math.floor(expiresAtMs / 1000);
    return `${expiresSec}.${grant.tenantId}.${this.mac(grant, expiresSec)}`;
  }

  /** Whether `token` grants `port` of `sandboxId` at `nowMs`, and to which tenant. Pure but for the secret. */
  check(token: string, sandboxId: string, port: number, nowMs: number): PortTokenCheck {
    const first = token.indexOf('.');
    const last = token.lastIndexOf('.');
    if (first <= 0 || last <= first + 1) return { ok: false, reason: 'malformed' };
    const expiresText = token.slice(0, first);
    if (!/^\d{1,12}$/.test(expiresText)) return { ok: false, reason: 'malformed' };
    const expiresSec = Number(expiresText);
    const tenantId = token.slice(first + 1, last);
    const expected = Buffer.from(this.mac({ tenantId, sandboxId, port }, expiresSec));
    const given = Buffer.from(token.slice(last + 1));
    if (given.length !== expected.length || !timingSafeEqual(given, expected)) return { ok: false, reason: 'mismatch' };
    // Checked after the signature: an expired token says so only to whoever could have signed it.
    if (expiresSec * 1000 <= nowMs) return { ok: false, reason: 'expired' };
    return { ok: true, tenantId };
  }

  private mac(grant: PortGrant, expiresSec: number): string {
    return createHmac('sha256', this.secret)
      .update(`capsule-port-url\0${grant.tenantId}\0${grant.sandboxId}\0${grant.port}\0${expiresSec}`)
      .digest('base64url');
  }
}

/** The port and sandbox a `P-ID.DOMAIN` host names (E2B's `getHost` shape), or undefined. */
export function parsePortHost(hostHeader: string | undefined, domain: string): { port: number; sandboxId: string } | undefined {
  if (hostHeader === undefined) return undefined;
  const host = hostHeader.toLowerCase().replace(/:\d+$/, '').replace(/\.$/, '');
  const suffix = `.${domain.toLowerCase()}`;
  if (!host.endsWith(suffix)) return undefined;
  const match = SANDBOX_HOST.exec(host.slice(0, -suffix.length));
  if (!match) return undefined;
  const port = Number(match[1]);
  if (port < 1 || port > 65_535) return undefined;
  return { port, sandboxId: match[2] ?? '' };
}

/** The URL path a host-routed request is served under: `/v1/sandboxes/ID/ports/P` and its own path (none with ''). */
export function portPath(sandboxId: string, port: number, rest = '/'): string {
  return `/v1/sandboxes/${sandboxId}/ports/${port}${rest === '' || rest.startsWith('/') ? rest : `/${rest}`}`;
}

/** A request URL without the signed-URL parameter, as the server in the sandbox should see it. */
export function withoutToken(pathAndQuery: string): string {
  const at = pathAndQuery.indexOf('?');
  if (at < 0) return pathAndQuery;
  const params = new URLSearchParams(pathAndQuery.slice(at + 1));
  if (!params.has(PORT_TOKEN_PARAM)) return pathAndQuery;
  params.delete(PORT_TOKEN_PARAM);
  const query = params.toString();
  return query === '' ? pathAndQuery.slice(0, at) : `${pathAndQuery.slice(0, at)}?${query}`;
}

/** The value of one cookie in a Cookie header, and the header without it. */
export function takeCookie(header: string | undefined, name: string): { value?: string; rest?: string } {
  if (header === undefined) return {};
  let value: string | undefined;
  const kept: string[] = [];
  for (const part of header.split(';')) {
    const trimmed = part.trim();
    if (trimmed === '') continue;
    const eq = trimmed.indexOf('=');
    if (eq > 0 && trimmed.slice(0, eq) === name) value = trimmed.slice(eq + 1);
    else kept.push(trimmed);
  }
  return { value, rest: kept.length > 0 ? kept.join('; ') : undefined };
}
