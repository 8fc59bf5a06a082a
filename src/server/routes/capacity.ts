import { CapacityInfoSchema } from '../../wire/index.js';
import { defineRoute, type AnyRoute } from '../route.js';
import type { ServerServices } from '../services.js';

/**
 * `GET /v1/capacity`: what the server can still admit (sandbox slots, memory, pids and disk
 * limits against what the host can back) and the caller's own quota of sandboxes. Aggregates
 * only: it names no other tenant's sandboxes.
 */
export function capacityRoutes(services: ServerServices): AnyRoute[] {
  return [
    defineRoute({
      name: 'capacity.get',
      method: 'GET',
      url: '/v1/capacity',
      summary: 'What the server can still admit: sandbox slots, and memory, pids and disk limits against what the host can back',
      auth: 'tenant',
      responses: { 200: { description: 'Limits, what is promised to live sandboxes, and what is free', schema: CapacityInfoSchema } },
      handler: async ({ principal }) => ({ kind: 'json', status: 200, body: await services.engine.capacityOf(principal.tenantId) }),
    }),
  ];
}
