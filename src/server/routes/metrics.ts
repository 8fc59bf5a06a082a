import { Readable } from 'node:stream';
import type { FastifyInstance } from 'fastify';
import { z } from 'zod';
import type { CapsuleMetrics } from '../../metrics/metrics.js';
import { defineRoute, type AnyRoute } from '../route.js';
import type { ServerServices } from '../services.js';

/**
 * `GET /metrics`: the Prometheus text exposition. Unauthenticated, like most exporters: the
 * server binds loopback by default (docs/operations.md says how to expose it). The gauge of
 * live sandboxes is read from the records at scrape time, so it is exact even after a crash; the
 * capacity gauges from admission control, at scrape time too.
 */
export function metricsRoutes(services: ServerServices): AnyRoute[] {
  const { metrics } = services;
  if (!metrics) return [];
  return [
    defineRoute({
      name: 'metrics',
      method: 'GET',
      url: '/metrics',
      summary: 'Prometheus metrics (text exposition format)',
      auth: 'none',
      responses: { 200: { description: 'Prometheus text', schema: z.string(), contentType: metrics.contentType } },
      async handler() {
        metrics.setActive(services.records.listLive().length);
        metrics.setCapacity(await services.engine.capacityOf(''));
        return { kind: 'raw', status: 200, stream: Readable.from([await metrics.render()]), contentType: metrics.contentType };
      },
    }),
  ];
}

/** Counts every answered request by its route pattern (never the URL: ids would be labels). */
export function recordRequests(app: FastifyInstance, metrics: CapsuleMetrics): void {
  app.addHook('onResponse', async (request, reply) => {
    metrics.recordRequest(request.routeOptions.url ?? 'unmatched', request.method, reply.statusCode);
  });
}
