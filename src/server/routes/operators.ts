import { z } from 'zod';
import { SandboxError } from '../../errors/index.js';
import { defineRoute, type AnyRoute } from '../route.js';
import { AuditQuery, AuditRecordSchema, ErrorBodySchema, MintedKeySchema, MintKeyBody, OperationParams, OperationSchema } from '../../wire/index.js';
import type { ServerServices } from '../services.js';

const error = (description: string) => ({ description, schema: ErrorBodySchema });

/** What a new key is granted beyond its tenant's own sandboxes, for the audit log. */
function grantsPolicy(body: { tenantId: string; admin?: boolean; mountRoots?: string[]; diskQuotaBytes?: number }): Record<string, unknown> | null {
  const policy: Record<string, unknown> = {};
  if (body.admin === true) Object.assign(policy, { admin: true, tenantId: body.tenantId });
  if (body.mountRoots !== undefined && body.mountRoots.length > 0) policy.mountRoots = body.mountRoots;
  if (body.diskQuotaBytes !== undefined) policy.diskQuotaBytes = body.diskQuotaBytes;
  return Object.keys(policy).length > 0 ? policy : null;
}

export function operatorRoutes(services: ServerServices): AnyRoute[] {
  return [
    defineRoute({
      name: 'keys.mint',
      method: 'POST',
      url: '/v1/keys',
      summary: 'Mint an API key for a tenant (admin); the key is shown once',
      auth: 'admin',
      body: MintKeyBody,
      responses: { 201: { description: 'The new key', schema: MintedKeySchema }, 403: error('Not an admin key') },
      audit: ({ body }) => ({ subject: body.tenantId, policy: grantsPolicy(body) }),
      // The secret is shown once: a replay says so instead of storing it in the operations table.
      replayBody: (body) => ({ ...(body as object), apiKey: null, note: 'the key is shown only once; mint another if it was lost' }),
      handler({ body }) {
        const mountRoots = body.mountRoots ?? [];
        const unknown = mountRoots.filter((root) => !services.engine.mountRootNames.includes(root));
        if (unknown.length > 0) {
          throw new SandboxError('INVALID_ARGUMENT', `mountRoots names roots this server does not have: ${unknown.join(', ')}`, {
            details: { field: 'mountRoots', unknown },
            hint: services.engine.mountRootNames.length > 0
              ? `The server's mount roots are: ${services.engine.mountRootNames.join(', ')}.`
              : 'Start the server with --mount-root NAME=PATH to offer host directories.',
          });
        }
        const grants = { mountRoots, ...(body.diskQuotaBytes !== undefined ? { diskQuotaBytes: body.diskQuotaBytes } : {}) };
        const minted = services.keys.mint(body.tenantId, { name: body.name, isAdmin: body.admin ?? false, grants });
        return {
          kind: 'json',
          status: 201,
          body: { keyId: minted.keyId, tenantId: minted.tenantId, apiKey: minted.apiKey, name: minted.name, admin: minted.isAdmin, grants: minted.grants },
        };
      },
    }),
    defineRoute({
      name: 'audit.list',
      method: 'GET',
      url: '/v1/audit',
      summary: 'Read the audit log (admin), oldest first (or newest with order=desc), filtered by tenant, sandbox, operation, outcome',
      auth: 'admin',
      query: AuditQuery,
      responses: { 200: { description: 'Records', schema: z.object({ records: z.array(AuditRecordSchema) }) } },
      handler: ({ query }) => ({
        kind: 'json',
        status: 200,
        body: {
          records: services.audit.list({
            after: query.after,
            before: query.before,
            limit: query.limit ?? 100,
            order: query.order,
            tenantId: query.tenant,
            sandboxId: query.sandboxId,
            operation: query.operation,
            outcome: query.outcome,
          }),
        },
      }),
    }),
    defineRoute({
      name: 'operations.get',
      method: 'GET',
      url: '/v1/operations/:key',
      summary: 'What happened to the call made with this Idempotency-Key',
      auth: 'tenant',
      params: OperationParams,
      responses: { 200: { description: 'The operation', schema: OperationSchema }, 404: error('Unknown or expired key') },
      handler({ params, principal }) {
        const operation = services.operations.get(principal.tenantId, params.key);
        if (!operation) {
          throw new SandboxError('NOT_FOUND', `no operation with Idempotency-Key "${params.key}"`, {
            details: { idempotencyKey: params.key },
            hint: 'Keys are kept 24 hours; a call that never reached the server has no operation, so it is safe to retry.',
          });
        }
        return { kind: 'json', status: 200, body: operation };
      },
    }),
    defineRoute({
      name: 'healthz',
      method: 'GET',
      url: '/healthz',
      summary: 'Liveness',
      auth: 'none',
      responses: { 200: { description: 'Alive', schema: z.object({ ok: z.literal(true) }) } },
      handler: () => ({ kind: 'json', status: 200, body: { ok: true } }),
    }),
  ];
}
