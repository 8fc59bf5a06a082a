import { z } from 'zod';
import { defineRoute, type AnyRoute } from '../route.js';
import { AuditRecordSchema, ErrorBodySchema, FeedEventSchema, ProcessParams, PtySizeSchema, SandboxAuditQuery, SandboxIdParams } from '../../wire/index.js';
import type { SandboxFeed } from '../console/sandbox-feed.js';
import { requireSandbox, type ServerServices } from '../services.js';

const error = (description: string) => ({ description, schema: ErrorBodySchema });

/** What a tenant watches of its own sandboxes: their changes, a terminal's size, their audit records. */
export function liveRoutes(services: ServerServices, feed: SandboxFeed | undefined): AnyRoute[] {
  const routes: AnyRoute[] = [
    defineRoute({
      name: 'processes.resize',
      method: 'POST',
      url: '/v1/sandboxes/:sandboxId/processes/:pid/resize',
      summary: 'Resize the terminal of a process started with pty',
      auth: 'tenant',
      params: ProcessParams,
      body: PtySizeSchema,
      responses: { 204: { description: 'Resized' }, 404: error('No such process, or it has ended') },
      handler({ params, principal, body }) {
        requireSandbox(services, principal.tenantId, params.sandboxId);
        services.engine.getProcess(principal.tenantId, params.sandboxId, params.pid).resize(body.cols, body.rows);
        return { kind: 'empty', status: 204 };
      },
    }),
    defineRoute({
      name: 'sandboxes.audit',
      method: 'GET',
      url: '/v1/sandboxes/:sandboxId/audit',
      summary: "The audit records of one of the tenant's sandboxes, oldest first (or newest with order=desc)",
      auth: 'tenant',
      params: SandboxIdParams,
      query: SandboxAuditQuery,
      responses: { 200: { description: 'Records', schema: z.object({ records: z.array(AuditRecordSchema) }) }, 404: error('No such sandbox') },
      handler({ params, query, principal }) {
        requireSandbox(services, principal.tenantId, params.sandboxId);
        const records = services.audit.list({ ...query, limit: query.limit ?? 100, tenantId: principal.tenantId, sandboxId: params.sandboxId });
        return { kind: 'json', status: 200, body: { records } };
      },
    }),
  ];
  if (feed) {
    routes.push(
      defineRoute({
        name: 'sandboxes.events',
        method: 'GET',
        url: '/v1/sandboxes/events',
        summary: "Live changes of the tenant's sandboxes: NDJSON FeedEvents (a snapshot of the live ones, then each change and usage reading) until the client goes away",
        auth: 'tenant',
        responses: { 200: { description: 'NDJSON FeedEvents', schema: FeedEventSchema, contentType: 'application/x-ndjson' } },
        handler: ({ principal, signal }) => ({ kind: 'ndjson', status: 200, events: feed.subscribe(principal.tenantId, signal) }),
      }),
    );
  }
  return routes;
}
