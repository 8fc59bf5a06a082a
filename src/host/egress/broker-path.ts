/** Why a request path is refused before any prefix is checked (`400 BROKER_BAD_PATH`). */
export interface BrokerPathProblem {
  problem: string;
}

/** A request target the broker checked: the handle, and the path and query it forwards. */
export interface BrokerTarget {
  handle: string;
  /** Below the handle, normalised (RFC 3986 6.2.2): what the prefixes are checked on and what is forwarded. */
  path: string;
  /** `?…` as received, or ''. */
  search: string;
}

const UNRESERVED = /^[A-Za-z0-9\-._~]$/;
/** Characters a path segment may hold unencoded (RFC 3986 pchar, minus `%`). */
const PCHAR = /^[A-Za-z0-9\-._~!$&'()*+,;=:@]$/;

/**
 * Normalises one raw path segment: percent-encoded unreserved characters are decoded, other
 * escapes keep their encoding (with upper-case hex), and characters a segment may not hold raw
 * are encoded. An encoded slash or backslash, a malformed escape or a control character is a
 * problem: upstream servers disagree on what they mean, so the broker refuses them.
 */
function normaliseSegment(raw: string): string | BrokerPathProblem {
  let out = '';
  for (let i = 0; i < raw.length; i++) {
    const char = raw.charAt(i);
    if (char === '%') {
      const hex = raw.slice(i + 1, i + 3);
      if (!/^[0-9A-Fa-f]{2}$/.test(hex)) return { problem: `a malformed percent escape "${raw.slice(i, i + 3)}"` };
      const code = parseInt(hex, 16);
      if (code === 0x2f || code === 0x5c) return { problem: `an encoded ${code === 0x2f ? 'slash (%2F)' : 'backslash (%5C)'}` };
      if (code < 0x20 || code === 0x7f) return { problem: 'an encoded control character' };
      const decoded = String.fromCharCode(code);
      out += UNRESERVED.test(decoded) ? decoded : `%${hex.toUpperCase()}`;
      i += 2;
    } else if (char === '\\') {
      return { problem: 'a backslash' };
    } else if (char.charCodeAt(0) < 0x20 || char.charCodeAt(0) === 0x7f) {
      return { problem: 'a control character' };
    } else {
      out += PCHAR.test(char) ? char : encodeURIComponent(char);
    }
  }
  if (out === '.' || out === '..') return { problem: `a dot segment "${raw}"` };
  return out;
}

/**
 * Parses the request target a sandbox sent to `broker.capsule` (as received, before any URL
 * parser resolved `..` or decoded anything): `/<handle>/<path>[?query]`. Encoded slashes and
 * backslashes, dot segments (also encoded, `%2e%2e`), empty segments and malformed escapes are
 * refused outright rather than resolved; what is returned is exactly what is checked against
 * the handle's prefixes and forwarded upstream.
 */
export function parseBrokerTarget(rawTarget: string): BrokerTarget | BrokerPathProblem {
  const queryAt = rawTarget.indexOf('?');
  const rawPath = queryAt === -1 ? rawTarget : rawTarget.slice(0, queryAt);
  const search = queryAt === -1 ? '' : rawTarget.slice(queryAt);
  if (rawTarget.includes('#')) return { problem: 'a fragment (#)' };
  if (!rawPath.startsWith('/')) return { problem: 'a path that does not start with /' };
  const [, rawHandle = '', ...rawRest] = rawPath.split('/');
  const handle = normaliseSegment(rawHandle);
  if (typeof handle !== 'string') return handle;
  const segments: string[] = [];
  for (const [index, raw] of rawRest.entries()) {
    const segment = normaliseSegment(raw);
    if (typeof segment !== 'string') return segment;
    // A trailing slash is kept (`/docs/`); an empty segment elsewhere (`/a//b`) is refused.
    if (segment === '' && index !== rawRest.length - 1) return { problem: 'an empty path segment (//)' };
    segments.push(segment);
  }
  return { handle, path: `/${segments.join('/')}`, search };
}

/**
 * Whether `path` (normalised) is under `prefix`, segment-wise: `/docs` and `/docs/` allow
 * `/docs/a`, never `/docsx`. The operator's prefix is normalised the same way first.
 */
export function pathUnder(path: string, prefix: string): boolean {
  const parsed = parseBrokerTarget(`/h${prefix}`);
  if ('problem' in parsed) return false;
  const normal = parsed.path;
  if (normal === '/') return true;
  const base = normal.endsWith('/') ? normal.slice(0, -1) : normal;
  return path === base || path.startsWith(`${base}/`);
}
