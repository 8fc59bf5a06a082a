import type { FastifyRequest } from 'fastify';
import { SandboxError } from '../../errors/index.js';
import { defineRoute, type AnyRoute } from '../route.js';
import { ErrorBodySchema, LoginBody, SessionSchema, WhoAmISchema } from '../../wire/index.js';
import { presentedKey, principalOf, type Principal } from '../auth.js';
import type { ConsoleSessions, Session } from '../console/sessions.js';
import type { ServerServices } from '../services.js';

const error = (description: string) => ({ description, schema: ErrorBodySchema });

const wireSession = (session: Session) => ({
  sessionKey: session.sessionKey,
  expiresAt: session.expiresAt,
  tenantId: session.record.tenantId,
  keyId: session.record.keyId,
  admin: session.record.isAdmin,
});

/** A session key is a secret: an idempotent replay says so instead of storing it. */
const replayBody = (body: unknown) => ({ ...(body as object), sessionKey: null, note: 'the session key is shown only once; sign in again' });

/** The login token in the body, redeemed once: the principal of the key it stands for. */
function loginPrincipal(sessions: ConsoleSessions, request: FastifyRequest): Principal {
  const token = (request.body as { loginToken?: unknown } | undefined)?.loginToken;
  const record = typeof token === 'string' ? sessions.redeemLoginToken(token) : undefined;
  if (!record) {
    throw new SandboxError('UNAUTHENTICATED', 'the login token is not valid: it was used already, it expired, or the server restarted since it was printed', {
      hint: 'Use the Console: URL the running capsule serve printed last (each works once, for 15 minutes), or sign in with an API key.',
    });
  }
  return principalOf(record);
}

/**
 * Browser sessions for the web console: a short-lived key in place of the long-lived one, got
 * from the one-time login token `capsule serve` prints or from an API key.
 */
export function sessionRoutes(services: ServerServices): AnyRoute[] {
  const { sessions } = services;
  const whoami = defineRoute({
    name: 'whoami',
    method: 'GET',
    url: '/v1/whoami',
    summary: 'Who the presented key is: its tenant, key id, whether it is an admin key, and when a session key ends',
    auth: 'tenant',
    responses: { 200: { description: 'The principal', schema: WhoAmISchema }, 401: error('No key, or not a valid one') },
    handler: ({ principal, headers }) => ({
      kind: 'json',
      status: 200,
      body: { tenantId: principal.tenantId, keyId: principal.keyId, admin: principal.isAdmin, sessionExpiresAt: sessions?.expiresAt(presentedKey({ headers }) ?? '') ?? null },
    }),
  });
  if (!sessions) return [whoami];
  // A session acts exactly as the principal that made it: same tenant, key id, admin flag, grants.
  const keyRecord = (principal: Principal) => ({ keyId: principal.keyId, tenantId: principal.tenantId, name: null, isAdmin: principal.isAdmin, createdAt: '', grants: principal.grants });
  return [
    whoami,
    defineRoute({
      name: 'sessions.login',
      method: 'POST',
      url: '/v1/sessions/login',
      summary: 'Exchange the one-time login token of the console URL for a session key (of the operator key)',
      auth: (request) => loginPrincipal(sessions, request),
      body: LoginBody,
      responses: { 201: { description: 'The session', schema: SessionSchema }, 401: error('The token is not valid, used or expired') },
      audit: () => ({}),
      replayBody,
      handler: ({ principal }) => ({ kind: 'json', status: 201, body: wireSession(sessions.create(keyRecord(principal))) }),
    }),
    defineRoute({
      name: 'sessions.create',
      method: 'POST',
      url: '/v1/sessions',
      summary: 'Exchange the presented key for a short-lived session key acting as it (a browser keeps only that)',
      auth: 'tenant',
      responses: { 201: { description: 'The session', schema: SessionSchema } },
      audit: () => ({}),
      replayBody,
      handler: ({ principal }) => ({ kind: 'json', status: 201, body: wireSession(sessions.create(keyRecord(principal))) }),
    }),
    defineRoute({
      name: 'sessions.end',
      method: 'DELETE',
      url: '/v1/sessions/current',
      summary: 'End the session whose key is presented (sign out)',
      auth: 'tenant',
      responses: { 204: { description: 'Ended' }, 400: error('The presented key is not a session key') },
      audit: () => ({}),
      handler({ headers }) {
        if (!sessions.revoke(presentedKey({ headers }) ?? '')) {
          throw new SandboxError('INVALID_ARGUMENT', 'the presented key is not a session key', {
            details: { field: 'authorization' },
            hint: 'Only a session key (from POST /v1/sessions) can be ended; API keys stay valid.',
          });
        }
        return { kind: 'empty', status: 204 };
      },
    }),
  ];
}
