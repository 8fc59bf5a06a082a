import { z } from 'zod';
import { NetworkPolicySchema } from '../../sandbox-spec/index.js';
import { defineRoute, type AnyRoute } from '../route.js';
import { ErrorBodySchema, SandboxIdParams, SandboxInfoSchema } from '../../wire/index.js';
import { requireSandbox, type ServerServices } from '../services.js';

/** Any JSON object: the engine validates it with the spec's schema (INVALID_SPEC names the field). */
const NetworkBody = z.record(z.string(), z.unknown());

/** What the audit log records of a policy change: the whole new policy (handle names, never secrets). */
export function networkPolicyOf(body: unknown): Record<string, unknown> | null {
  const parsed = NetworkPolicySchema.safeParse(body ?? {});
  if (!parsed.success) return null; // the call fails with INVALID_SPEC; nothing is opened
  const { mode, allow, handles, maxConnections, maxConcurrentConnections, publicPorts } = parsed.data;
  return { network: { mode, allow, handles, maxConnections, maxConcurrentConnections, publicPorts } };
}

/** `PUT /v1/sandboxes/{id}/network`: replaces a running sandbox's network policy. */
export function networkRoutes(services: ServerServices): AnyRoute[] {
  const engine = services.engine;
  return [
    defineRoute({
      name: 'sandboxes.setNetwork',
      method: 'PUT',
      url: '/v1/sandboxes/:sandboxId/network',
      summary: 'Replace the network policy of a running sandbox; new connections follow it at once',
      auth: 'tenant',
      params: SandboxIdParams,
      body: NetworkBody,
      bodyDoc: NetworkPolicySchema,
      responses: {
        200: { description: 'The sandbox with its new spec.network', schema: SandboxInfoSchema },
        404: { description: 'No such sandbox', schema: ErrorBodySchema },
        409: { description: 'The sandbox is not running (paused or ended)', schema: ErrorBodySchema },
        422: { description: 'Invalid policy, or a sandbox created without a network (BACKEND_CANNOT_ENFORCE)', schema: ErrorBodySchema },
      },
      audit: ({ params, body }) => ({ sandboxId: params.sandboxId, policy: networkPolicyOf(body) }),
      async handler({ params, body, principal }) {
        requireSandbox(services, principal.tenantId, params.sandboxId);
        const info = await engine.setNetworkPolicy(principal.tenantId, params.sandboxId, body);
        return { kind: 'json', status: 200, body: info };
      },
    }),
  ];
}
