import { isSandboxError } from '../../errors/index.js';
import { loosenings, SandboxSpecSchema, type SandboxSpecInput } from '../../sandbox-spec/index.js';
import { z } from 'zod';
import { defineRoute, type AnyRoute } from '../route.js';
import { CreateSandboxBody, ErrorBodySchema, ListSandboxesQuery, MetadataSchema, SandboxIdParams, SandboxInfoSchema, SandboxPageSchema, SetTimeoutBody } from '../../wire/index.js';
import { requireSandbox, type ServerServices } from '../services.js';
import { mountGrantOf } from '../auth.js';

const error = (description: string) => ({ description, schema: ErrorBodySchema });

/**
 * Every way a spec opens more than the least capable sandbox (raised limits, a longer TTL,
 * network, handles, mounts), for the audit log; null when it opens nothing or is invalid.
 */
export function policyOf(input: unknown): Record<string, unknown> | null {
  // The schema alone: the server's maxima decide whether the create goes on, not what it asked.
  const parsed = SandboxSpecSchema.safeParse(input ?? {});
  if (!parsed.success) return null; // the create fails with INVALID_SPEC; nothing is opened
  return (loosenings(parsed.data) as Record<string, unknown> | undefined) ?? null;
}

export function sandboxRoutes(services: ServerServices): AnyRoute[] {
  const { engine, records } = services;
  return [
    defineRoute({
      name: 'sandboxes.create',
      method: 'POST',
      url: '/v1/sandboxes',
      summary: 'Create a sandbox',
      auth: 'tenant',
      body: CreateSandboxBody.optional(),
      bodyDoc: z.strictObject({ spec: SandboxSpecSchema.optional(), metadata: MetadataSchema.optional(), waitForCapacityMs: CreateSandboxBody.shape.waitForCapacityMs }),
      responses: {
        201: { description: 'The sandbox, running', schema: SandboxInfoSchema },
        422: error('Invalid spec, or above the operator maximum'),
        429: error('The tenant has its quota of concurrent sandboxes (see Retry-After), or its disk quota cannot hold limits.diskBytes more (QUOTA_EXCEEDED)'),
        503: error('The host cannot back the sandbox now: the server\'s sandbox count, memory, pids or the workspace volume (CAPACITY_EXHAUSTED; see Retry-After and GET /v1/capacity)'),
      },
      audit: ({ body }) => ({ policy: policyOf(body?.spec) }),
      async handler({ body, principal, signal }) {
        const info = await engine.create({
          tenantId: principal.tenantId,
          spec: body?.spec as SandboxSpecInput | undefined,
          metadata: body?.metadata,
          signal,
          ...(body?.waitForCapacityMs !== undefined ? { waitForCapacityMs: body.waitForCapacityMs } : {}),
          grants: { mountRoots: mountGrantOf(principal), diskQuotaBytes: principal.grants.diskQuotaBytes },
        });
        return { kind: 'json', status: 201, body: info };
      },
    }),
    defineRoute({
      name: 'sandboxes.list',
      method: 'GET',
      url: '/v1/sandboxes',
      summary: 'List sandboxes (also ended ones), filtered by state and metadata, oldest first',
      auth: 'tenant',
      query: ListSandboxesQuery,
      responses: { 200: { description: 'One page', schema: SandboxPageSchema } },
      handler: ({ query, principal }) => ({
        kind: 'json',
        status: 200,
        body: records.page({ tenantId: principal.tenantId, states: query.state, metadata: query.metadata, limit: query.limit, cursor: query.cursor }),
      }),
    }),
    defineRoute({
      name: 'sandboxes.get',
      method: 'GET',
      url: '/v1/sandboxes/:sandboxId',
      summary: 'Get a sandbox',
      auth: 'tenant',
      params: SandboxIdParams,
      responses: { 200: { description: 'The sandbox', schema: SandboxInfoSchema }, 404: error('No such sandbox') },
      handler: ({ params, principal }) => ({ kind: 'json', status: 200, body: requireSandbox(services, principal.tenantId, params.sandboxId) }),
    }),
    defineRoute({
      name: 'sandboxes.kill',
      method: 'DELETE',
      url: '/v1/sandboxes/:sandboxId',
      summary: 'Kill a sandbox (its record stays, state killed)',
      auth: 'tenant',
      params: SandboxIdParams,
      responses: { 200: { description: 'The ended sandbox', schema: SandboxInfoSchema }, 404: error('No such sandbox') },
      audit: ({ params }) => ({ sandboxId: params.sandboxId }),
      async handler({ params, principal }) {
        const record = requireSandbox(services, principal.tenantId, params.sandboxId);
        try {
          return { kind: 'json', status: 200, body: await engine.kill(principal.tenantId, params.sandboxId) };
        } catch (error) {
          // A sandbox that ended before a restart is only a record now: killing it is a no-op.
          if (isSandboxError(error, 'SANDBOX_NOT_FOUND') && record.endedAt !== undefined) return { kind: 'json', status: 200, body: record };
          throw error;
        }
      },
    }),
    defineRoute({
      name: 'sandboxes.setTimeout',
      method: 'POST',
      url: '/v1/sandboxes/:sandboxId/timeout',
      summary: 'Set the time to live to now + ttlMs (shortens or extends)',
      auth: 'tenant',
      params: SandboxIdParams,
      body: SetTimeoutBody,
      responses: { 200: { description: 'The sandbox with its new expiresAt', schema: SandboxInfoSchema }, 409: error('The sandbox has ended') },
      audit: ({ params }) => ({ sandboxId: params.sandboxId }),
      handler({ params, body, principal }) {
        requireSandbox(services, principal.tenantId, params.sandboxId);
        return { kind: 'json', status: 200, body: engine.setTimeout(principal.tenantId, params.sandboxId, body.ttlMs) };
      },
    }),
    defineRoute({
      name: 'sandboxes.keepalive',
      method: 'POST',
      url: '/v1/sandboxes/:sandboxId/keepalive',
      summary: "Extend the time to live to now + the spec's ttlMs",
      auth: 'tenant',
      params: SandboxIdParams,
      responses: { 200: { description: 'The sandbox with its new expiresAt', schema: SandboxInfoSchema }, 409: error('The sandbox has ended') },
      audit: ({ params }) => ({ sandboxId: params.sandboxId }),
      handler({ params, principal }) {
        const record = requireSandbox(services, principal.tenantId, params.sandboxId);
        return { kind: 'json', status: 200, body: engine.setTimeout(principal.tenantId, params.sandboxId, record.spec.ttlMs) };
      },
    }),
  ];
}
