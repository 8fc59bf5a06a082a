import type { FastifyRequest } from 'fastify';
import { SandboxError } from '../../errors/index.js';
import { SANDBOX_ID_PATTERN } from '../../wire/index.js';
import { authenticate, type Principal } from '../auth.js';
import type { ServerServices } from '../services.js';
import { PORT_TOKEN_COOKIE, PORT_TOKEN_PARAM, takeCookie } from './port-access.js';

/** How a port request proved its access; decides which of its headers the sandbox must not see. */
export type PortCredential = 'public' | 'signed-url' | 'access-token' | 'api-key';

/** The key ids audit and logs show for port requests that carry no API key. */
const CREDENTIAL_KEY_IDS: Record<Exclude<PortCredential, 'api-key'>, string> = {
  public: 'public-port',
  'signed-url': 'port-url',
  'access-token': 'sandbox-access-token',
};

/** Headers that carry a sandbox access token (E2B's traffic token, or envd's). */
export const ACCESS_TOKEN_HEADERS = ['e2b-traffic-access-token', 'x-access-token'] as const;

export interface PortPrincipal extends Principal {
  credential: PortCredential;
  /** The signed-URL token presented in the query (set as a cookie on the answer). */
  queryToken?: string;
}

function unauthenticated(message: string, sandboxId: string, port: number): SandboxError {
  return new SandboxError('UNAUTHENTICATED', message, {
    details: { sandboxId, port },
    hint: `Open a signed URL (capsule sandbox url ${sandboxId} ${port}, or POST /v1/sandboxes/${sandboxId}/ports/${port}/url), send the tenant's API key (Authorization: Bearer …) or the sandbox's access token (E2b-Traffic-Access-Token), or create the sandbox with network.publicPorts: [${port}].`,
  });
}

/**
 * Who may reach port P of a sandbox, tried in this order: anyone when the sandbox was created with
 * P in `network.publicPorts`; a signed URL's token (query or its cookie) for that port; the
 * sandbox's access token; the owning tenant's API key. The handler still looks the sandbox up
 * under the principal's tenant, so a key of another tenant finds nothing (404).
 */
export function portPrincipal(services: ServerServices, request: FastifyRequest, nowMs: number): PortPrincipal {
  const params = request.params as { sandboxId?: string; port?: string };
  const sandboxId = params.sandboxId ?? '';
  const port = Number(params.port);
  if (!SANDBOX_ID_PATTERN.test(sandboxId) || !Number.isInteger(port) || port < 1 || port > 65_535) {
    // The params are refused by the route's schema, with the code of what is missing.
    return scoped('', sandboxId, 'public');
  }
  const record = services.records.findById(sandboxId);
  if (record?.spec.network.publicPorts?.includes(port) === true) return scoped(record.tenantId, sandboxId, 'public');

  const query = request.query as Record<string, unknown> | undefined;
  const queryToken = typeof query?.[PORT_TOKEN_PARAM] === 'string' ? query[PORT_TOKEN_PARAM] : undefined;
  const token = queryToken ?? takeCookie(request.headers.cookie, PORT_TOKEN_COOKIE).value;
  if (token !== undefined) {
    const check = services.portUrls.check(token, sandboxId, port, nowMs);
    if (check.ok) return { ...scoped(check.tenantId, sandboxId, 'signed-url'), ...(queryToken !== undefined && { queryToken }) };
    // A token that is not for this port is refused, even when a key is sent too: a link that
    // stopped working says so instead of working for one user and not another.
    throw unauthenticated(
      check.reason === 'expired' ? `the port URL for port ${port} has expired` : `the port URL token is not valid for port ${port} of sandbox ${sandboxId}`,
      sandboxId,
      port,
    );
  }

  for (const name of ACCESS_TOKEN_HEADERS) {
    const value = request.headers[name];
    if (typeof value !== 'string' || value === '') continue;
    const tenantId = services.accessTokens.tenantOf(value, sandboxId);
    if (tenantId === undefined) throw unauthenticated(`the ${name} header is not an access token of sandbox ${sandboxId}`, sandboxId, port);
    return scoped(tenantId, sandboxId, 'access-token');
  }

  if (request.headers.authorization !== undefined || request.headers['x-api-key'] !== undefined) {
    return { ...authenticate(request, services.keys, 'tenant'), credential: 'api-key' };
  }
  throw unauthenticated(`port ${port} of sandbox ${sandboxId} needs a credential`, sandboxId, port);
}

function scoped(tenantId: string, sandboxId: string, credential: Exclude<PortCredential, 'api-key'>): PortPrincipal {
  return { tenantId, sandboxId, keyId: CREDENTIAL_KEY_IDS[credential], isAdmin: false, grants: { mountRoots: [] }, credential };
}
