import { defineRoute, type AnyRoute } from '../route.js';
import { ApplyChangesBody, ApplyResultSchema, ChangesQuery, ChangesSchema, CreateSnapshotBody, ErrorBodySchema, ForkBody, ForkResultSchema, SandboxIdParams, SnapshotIdParams, SnapshotInfoSchema, SnapshotListSchema } from '../../wire/index.js';
import { requireSandbox, type ServerServices } from '../services.js';
import { mountGrantOf } from '../auth.js';

const error = (description: string) => ({ description, schema: ErrorBodySchema });

/** Snapshots of sandboxes (`/v1/sandboxes/{id}/snapshots`, `/v1/snapshots`) and forks. */
export function snapshotRoutes(services: ServerServices): AnyRoute[] {
  const { engine } = services;
  return [
    defineRoute({
      name: 'sandboxes.snapshot',
      method: 'POST',
      url: '/v1/sandboxes/:sandboxId/snapshots',
      summary: 'Snapshot a running or paused sandbox: root and workspace at one instant (the sandbox is frozen for it)',
      auth: 'tenant',
      params: SandboxIdParams,
      body: CreateSnapshotBody.optional(),
      responses: {
        201: { description: 'The snapshot', schema: SnapshotInfoSchema },
        404: error('No such sandbox'),
        409: error('The sandbox is not running or paused'),
        422: error('The backend cannot take this mode (BACKEND_CANNOT_ENFORCE)'),
        429: error("What the sandbox wrote beyond its origin does not fit the tenant's disk quota (QUOTA_EXCEEDED)"),
      },
      audit: ({ params }) => ({ sandboxId: params.sandboxId }),
      async handler({ params, body, principal }) {
        requireSandbox(services, principal.tenantId, params.sandboxId);
        const info = await engine.snapshot(principal.tenantId, params.sandboxId, {
          ...(body?.name !== undefined ? { name: body.name } : {}),
          ...(body?.mode ? { mode: body.mode } : {}),
          ...(body?.includeVolumes !== undefined ? { includeVolumes: body.includeVolumes } : {}),
        });
        return { kind: 'json', status: 201, body: info };
      },
    }),
    defineRoute({
      name: 'sandboxes.fork',
      method: 'POST',
      url: '/v1/sandboxes/:sandboxId/fork',
      summary: 'N new sandboxes from one snapshot of this one; each fork is reported on its own (its sandbox or its error)',
      auth: 'tenant',
      params: SandboxIdParams,
      body: ForkBody,
      responses: {
        201: { description: 'The snapshot the forks came from, and an entry per fork', schema: ForkResultSchema },
        404: error('No such sandbox'),
        409: error('The sandbox is not running or paused'),
        422: error('The backend cannot keep processes in a snapshot (mode full: BACKEND_CANNOT_ENFORCE)'),
        429: error('The forks would exceed the tenant\'s quota of concurrent sandboxes'),
        503: error('The server admits fewer sandboxes than the forks need (CAPACITY_EXHAUSTED; see Retry-After)'),
      },
      audit: ({ params }) => ({ sandboxId: params.sandboxId }),
      async handler({ params, body, principal, signal }) {
        requireSandbox(services, principal.tenantId, params.sandboxId);
        // The engine checks every slot first: a fork that would overshoot the quota makes nothing.
        const result = await engine.fork(principal.tenantId, params.sandboxId, {
          count: body.count,
          ...(body.mode ? { mode: body.mode } : {}),
          ...(body.metadata ? { metadata: body.metadata } : {}),
          signal,
          grants: { mountRoots: mountGrantOf(principal), diskQuotaBytes: principal.grants.diskQuotaBytes },
        });
        return { kind: 'json', status: 201, body: result };
      },
    }),
    defineRoute({
      name: 'sandboxes.changes',
      method: 'GET',
      url: '/v1/sandboxes/:sandboxId/changes',
      summary: 'Added, modified and deleted paths (sizes, sha256) against the snapshot or template the sandbox came from, or `since` a snapshot',
      auth: 'tenant',
      params: SandboxIdParams,
      query: ChangesQuery,
      responses: {
        200: { description: 'The changes', schema: ChangesSchema },
        404: error('No such sandbox or snapshot'),
        409: error('The sandbox is not running or paused'),
      },
      async handler({ params, query, principal }) {
        requireSandbox(services, principal.tenantId, params.sandboxId);
        const changes = await engine.changes(principal.tenantId, params.sandboxId, query.since !== undefined ? { since: query.since } : {});
        return { kind: 'json', status: 200, body: changes };
      },
    }),
    defineRoute({
      name: 'sandboxes.changes.export',
      method: 'GET',
      url: '/v1/sandboxes/:sandboxId/changes/export',
      summary: 'The added and modified files, directories and symlinks as a tar (deletions are in GET .../changes)',
      auth: 'tenant',
      params: SandboxIdParams,
      query: ChangesQuery,
      responses: { 200: { description: 'A POSIX tar (pax)' }, 404: error('No such sandbox or snapshot'), 409: error('The sandbox is not running or paused') },
      async handler({ params, query, principal }) {
        requireSandbox(services, principal.tenantId, params.sandboxId);
        const stream = await engine.exportChanges(principal.tenantId, params.sandboxId, query.since !== undefined ? { since: query.since } : {});
        return { kind: 'raw', status: 200, stream, contentType: 'application/x-tar' };
      },
    }),
    defineRoute({
      name: 'sandboxes.changes.apply',
      method: 'POST',
      url: '/v1/sandboxes/:sandboxId/changes/apply',
      summary: 'Apply the changes of a fork of this sandbox to it; refused (409, with the paths) where this sandbox changed the same paths since the fork',
      auth: 'tenant',
      params: SandboxIdParams,
      body: ApplyChangesBody,
      responses: {
        200: { description: 'What was applied', schema: ApplyResultSchema },
        400: error('`from` is not a fork of this sandbox'),
        404: error('No such sandbox'),
        409: error('Both changed the same paths (details.paths), or a sandbox is not running'),
      },
      audit: ({ params }) => ({ sandboxId: params.sandboxId }),
      async handler({ params, body, principal }) {
        requireSandbox(services, principal.tenantId, params.sandboxId);
        requireSandbox(services, principal.tenantId, body.from);
        return { kind: 'json', status: 200, body: await engine.applyChanges(principal.tenantId, params.sandboxId, { from: body.from }) };
      },
    }),
    defineRoute({
      name: 'snapshots.list',
      method: 'GET',
      url: '/v1/snapshots',
      summary: 'List your snapshots, oldest first',
      auth: 'tenant',
      responses: { 200: { description: 'The snapshots', schema: SnapshotListSchema } },
      handler: ({ principal }) => ({ kind: 'json', status: 200, body: { snapshots: engine.listSnapshots(principal.tenantId) } }),
    }),
    defineRoute({
      name: 'snapshots.get',
      method: 'GET',
      url: '/v1/snapshots/:snapshotId',
      summary: 'A snapshot with its lineage, size and creation time',
      auth: 'tenant',
      params: SnapshotIdParams,
      responses: { 200: { description: 'The snapshot', schema: SnapshotInfoSchema }, 404: error('No such snapshot') },
      handler: ({ params, principal }) => ({ kind: 'json', status: 200, body: engine.getSnapshot(principal.tenantId, params.snapshotId) }),
    }),
    defineRoute({
      name: 'snapshots.delete',
      method: 'DELETE',
      url: '/v1/snapshots/:snapshotId',
      summary: 'Delete a snapshot and its data (refused while a live sandbox was made from it)',
      auth: 'tenant',
      params: SnapshotIdParams,
      responses: { 204: { description: 'Deleted' }, 404: error('No such snapshot'), 409: error('Live sandboxes were made from it') },
      async handler({ params, principal }) {
        await engine.deleteSnapshot(principal.tenantId, params.snapshotId);
        return { kind: 'empty', status: 204 };
      },
    }),
  ];
}
