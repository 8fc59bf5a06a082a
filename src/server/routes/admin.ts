import { defineRoute, type AnyRoute } from '../route.js';
import { AdminFeedQuery, AdminSandboxesQuery, AuditVerifySchema, ErrorBodySchema, FeedEventSchema, MetricsHistorySchema, SandboxPageSchema } from '../../wire/index.js';
import { hostCapacity } from '../console/capacity.js';
import { MetricsHistory } from '../console/metrics-history.js';
import type { SandboxFeed } from '../console/sandbox-feed.js';
import type { ServerServices } from '../services.js';

const error = (description: string) => ({ description, schema: ErrorBodySchema });
const ADMIN_ONLY = error('Not an admin key');

export interface AdminRouteOptions {
  feed?: SandboxFeed;
  /** The data directory, whose filesystem the capacity reports. */
  dataDir?: string;
}

/** The operator's views across tenants: sandboxes, their changes, metrics history, audit verification. */
export function adminRoutes(services: ServerServices, options: AdminRouteOptions): AnyRoute[] {
  const { records, metrics, feed } = { ...services, feed: options.feed };
  const routes: AnyRoute[] = [
    defineRoute({
      name: 'admin.sandboxes.list',
      method: 'GET',
      url: '/v1/admin/sandboxes',
      summary: "List every tenant's sandboxes (admin), or one tenant's with ?tenant=, oldest first",
      auth: 'admin',
      query: AdminSandboxesQuery,
      responses: { 200: { description: 'One page', schema: SandboxPageSchema }, 403: ADMIN_ONLY },
      handler: ({ query }) => ({
        kind: 'json',
        status: 200,
        body: records.page({ tenantId: query.tenant ?? null, states: query.state, metadata: query.metadata, limit: query.limit, cursor: query.cursor }),
      }),
    }),
    defineRoute({
      name: 'audit.verify',
      method: 'GET',
      url: '/v1/audit/verify',
      summary: "Recompute the audit log's hash chain (admin): ok with the head hash, or the first record that does not match",
      auth: 'admin',
      responses: { 200: { description: 'The verification result', schema: AuditVerifySchema }, 403: ADMIN_ONLY },
      handler: () => ({ kind: 'json', status: 200, body: services.audit.verify() }),
    }),
  ];
  if (feed) {
    routes.push(
      defineRoute({
        name: 'admin.sandboxes.events',
        method: 'GET',
        url: '/v1/admin/sandboxes/events',
        summary: "Live changes of every tenant's sandboxes (admin), or one tenant's: NDJSON FeedEvents until the client goes away",
        auth: 'admin',
        query: AdminFeedQuery,
        responses: { 200: { description: 'NDJSON FeedEvents', schema: FeedEventSchema, contentType: 'application/x-ndjson' }, 403: ADMIN_ONLY },
        handler: ({ query, signal }) => ({ kind: 'ndjson', status: 200, events: feed.subscribe(query.tenant ?? null, signal) }),
      }),
    );
  }
  if (metrics) {
    const history = new MetricsHistory(metrics.registry);
    services.closeSignal.addEventListener('abort', () => history.close(), { once: true });
    routes.push(
      defineRoute({
        name: 'admin.metrics',
        method: 'GET',
        url: '/v1/admin/metrics',
        summary: 'The operating metrics over the last hour as JSON (admin): create percentiles, limit terminations, blocked egress, artifact deliveries, and host capacity',
        auth: 'admin',
        responses: { 200: { description: 'Samples, oldest first, and capacity now', schema: MetricsHistorySchema }, 403: ADMIN_ONLY },
        async handler() {
          const live = records.listLive();
          metrics.setActive(live.length);
          return {
            kind: 'json',
            status: 200,
            body: { intervalMs: history.intervalMs, windowMs: history.windowMs, samples: await history.samples(), capacity: await hostCapacity(live, options.dataDir) },
          };
        },
      }),
    );
  }
  return routes;
}

