import type { FastifyRequest } from 'fastify';
import { AuditTrail } from '../audit-trail.js';
import type { AuditSubject } from '../route.js';
import type { SandboxAccess } from './access.js';
import type { E2bContext } from './deps.js';

/** The key id audit records carry for data-plane calls, which authenticate with an access token. */
export const ENVD_TOKEN_KEY_ID = 'e2b-access-token';

/**
 * Records a mutating data-plane call (process start, file write, code run) in the audit log the
 * way the v1 routes' seam does: an attempt before, an outcome after. `outcome` lets a stream
 * report its real end (a process's exit) after the call has returned.
 */
export async function audited<T>(
  ctx: E2bContext,
  request: FastifyRequest,
  access: SandboxAccess,
  operation: string,
  subject: Omit<AuditSubject, 'sandboxId'>,
  run: () => Promise<T>,
  outcome?: (value: T) => Promise<{ type: string }>,
): Promise<T> {
  if (!ctx.audit) return run();
  const principal = { tenantId: access.tenantId, keyId: ENVD_TOKEN_KEY_ID, isAdmin: false, grants: { mountRoots: [] } };
  const trail = new AuditTrail(ctx.audit, `e2b.${operation}`, principal, request.id);
  trail.attempt({ ...subject, sandboxId: access.sandboxId });
  let value: T;
  try {
    value = await run();
  } catch (error) {
    trail.failed(error);
    throw error;
  }
  if (!outcome) {
    trail.succeeded();
    return value;
  }
  outcome(value).then(
    (event) => trail.succeeded(undefined, event),
    (error: unknown) => trail.failed(error),
  ).catch((error: unknown) => request.log.warn({ err: error }, 'audit outcome not recorded'));
  return value;
}
