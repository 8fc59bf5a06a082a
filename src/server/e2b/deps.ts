import type { FastifyInstance } from 'fastify';
import type { SandboxEngine } from '../../engine/types.js';
import type { SandboxInfo } from '../../wire/index.js';
import type { ApiKeyStore, AuditLog } from '../../store/index.js';
import type { TenantQuota } from '../quota.js';
import type { EnvdTokens } from './access.js';

export interface E2bFacadeDeps {
  engine: SandboxEngine;
  keys: ApiKeyStore;
  /** Records create/kill/pause/connect/timeout like the v1 routes do. */
  audit?: AuditLog;
  /** Every tenant's live sandboxes: the candidates for a signed file URL, which names none. */
  records?: { listLive(): SandboxInfo[] };
  /** Concurrent sandboxes per tenant, shared with the v1 routes. */
  quota?: TenantQuota;
  /** HMAC key of envd access tokens. @default random per server start */
  tokenSecret?: Buffer;
  /** Aborted when the server closes: ends streams that never end by themselves (watch). */
  closeSignal?: AbortSignal;
}

/** What the facade's resources share. */
export interface E2bContext extends E2bFacadeDeps {
  tokens: EnvdTokens;
}

/** The envd version the facade reports: what it implements, by the SDK's version gates. */
export const ENVD_VERSION = '0.5.7';

/** The route constraint selecting one E2B port (see index.ts). */
// A type alias (not an interface) so it fits Fastify's indexed RouteConstraint.
export type PortConstraint = { e2bPort: string };

/**
 * JSON bodies as E2B's clients send them: some POSTs carry `Content-Type: application/json` and
 * no body at all (code-interpreter restart), which Fastify's own parser refuses.
 */
export function lenientJson(app: FastifyInstance): void {
  app.removeContentTypeParser('application/json');
  app.addContentTypeParser('application/json', { parseAs: 'string' }, (_request, body, done) => {
    const text = typeof body === 'string' ? body : body.toString('utf8');
    if (text.trim() === '') return done(null, undefined);
    try {
      done(null, JSON.parse(text) as unknown);
    } catch (error) {
      (error as { statusCode?: number }).statusCode = 400;
      done(error as Error, undefined);
    }
  });
}
