import { z } from 'zod';
import { HTTP_STATUS, SandboxError } from '../../errors/index.js';
import { CreateVolumeBody, type SnapshotInfo, type VolumeInfo } from '../../wire/index.js';
import { mountGrantOf } from '../auth.js';
import { defineRoute, type AnyRoute, type Authenticate } from '../route.js';
import { e2bPrincipal } from './access.js';
import { liveSandbox, sandboxBody, TEMPLATE_KEY } from './answers.js';
import type { E2bContext } from './deps.js';
import { isSnapshotId } from './lifecycle.js';

const GiB = 1024 ** 3;
/** E2B volumes have no size: each is made with this limit, charged to the tenant's disk quota. */
export const E2B_VOLUME_BYTES = GiB;

const SandboxParams = z.object({ id: z.string().min(1) });
const VolumeParams = z.object({ volumeID: z.string().min(1) });
const TemplateParams = z.object({ templateID: z.string().min(1) });
const SnapshotBody = z.object({ name: z.string().min(1).max(128).optional() }).loose().optional();
const ForkBody = z.object({ count: z.number().int().min(1).max(100).default(1), timeout: z.number().int().positive().optional() }).loose().optional();
// The name is Capsule's volume name (the one /v1 and spec.volumes use): one that could not be
// mounted or deleted there is refused here, not made.
const VolumeBody = z.object({ name: CreateVolumeBody.shape.name }).loose();
const SnapshotQuery = z.object({
  sandboxID: z.string().optional(),
  name: z.string().optional(),
  limit: z.string().optional(),
  nextToken: z.string().optional(),
}).loose();

/** E2B's `SnapshotInfo`: its id and its names (Capsule's snapshot name when it has one). */
function snapshotBody(info: SnapshotInfo) {
  return { snapshotID: info.snapshotId, names: info.name !== undefined ? [info.name] : [] };
}

/**
 * E2B's state endpoints over Capsule's snapshots, forks and volumes (docs/e2b-compatibility.md):
 * `createSnapshot()` / `listSnapshots()` / `deleteSnapshot()`, `fork()`, and `Volume.create /
 * list / getInfo / destroy`. Everything is the tenant's own: another tenant's snapshot or volume
 * is a 404, as an unknown one.
 */
export function stateRoutes(ctx: E2bContext): AnyRoute[] {
  const { engine } = ctx;
  const auth: Authenticate = (request) => e2bPrincipal(request, ctx.keys);
  const volumeBody = (info: VolumeInfo) => ({ volumeID: info.volumeId, name: info.name, token: ctx.tokens.issue(info.tenantId, info.volumeId) });
  return [
    defineRoute({
      name: 'e2b.snapshots.create',
      method: 'POST',
      url: '/sandboxes/:id/snapshots',
      summary: 'E2B: snapshot a sandbox (root and workspace at one instant; it runs on)',
      auth,
      params: SandboxParams,
      body: SnapshotBody,
      audit: ({ params }) => ({ sandboxId: params.id }),
      async handler({ params, body, principal }) {
        liveSandbox(engine, principal.tenantId, params.id);
        const info = await engine.snapshot(principal.tenantId, params.id, body?.name !== undefined ? { name: body.name } : {});
        return { kind: 'json', status: 201, body: snapshotBody(info) };
      },
    }),
    defineRoute({
      name: 'e2b.snapshots.list',
      method: 'GET',
      url: '/snapshots',
      summary: "E2B: the tenant's snapshots, oldest first, paged with X-Next-Token",
      auth,
      query: SnapshotQuery,
      handler({ query, principal }) {
        const all = engine
          .listSnapshots(principal.tenantId)
          .filter((s) => query.sandboxID === undefined || s.sandboxId === query.sandboxID)
          .filter((s) => query.name === undefined || s.name === query.name || s.snapshotId === query.name);
        // The page token is the id of the last snapshot sent; ids are unique and the list is stable.
        const after = query.nextToken ? Buffer.from(query.nextToken, 'base64url').toString() : undefined;
        const at = after === undefined ? -1 : all.findIndex((s) => s.snapshotId === after);
        if (after !== undefined && at < 0) {
          // Starting over would hand a paging client the first page again, forever.
          throw new SandboxError('INVALID_ARGUMENT', 'nextToken names no snapshot of this listing (it was deleted, or the token is not one this server sent)', {
            details: { field: 'nextToken' },
            hint: 'List again without nextToken.',
          });
        }
        const start = at + 1;
        const limit = Math.min(Math.max(Number(query.limit) || 100, 1), 1000);
        const page = all.slice(start, start + limit);
        const last = page[page.length - 1];
        const headers = last && start + limit < all.length ? { 'x-next-token': Buffer.from(last.snapshotId).toString('base64url') } : undefined;
        return { kind: 'json', status: 200, body: page.map(snapshotBody), ...(headers ? { headers } : {}) };
      },
    }),
    defineRoute({
      // The SDK's deleteSnapshot(); E2B's snapshots are templates, so it is the template delete.
      name: 'e2b.templates.delete',
      method: 'DELETE',
      url: '/templates/:templateID',
      summary: "E2B: delete a snapshot (by its id) or one of the tenant's templates",
      auth,
      params: TemplateParams,
      audit: ({ params }) => ({ subject: params.templateID }),
      async handler({ params, principal }) {
        if (isSnapshotId(params.templateID)) await engine.deleteSnapshot(principal.tenantId, params.templateID);
        else if (ctx.templates) await ctx.templates.service.remove(principal.tenantId, params.templateID);
        else throw new SandboxError('TEMPLATE_NOT_FOUND', `no template or snapshot ${params.templateID}`, { details: { templateID: params.templateID } });
        return { kind: 'empty', status: 204 };
      },
    }),
    defineRoute({
      name: 'e2b.sandboxes.fork',
      method: 'POST',
      url: '/sandboxes/:id/fork',
      summary: 'E2B: N new sandboxes from one snapshot of this one, each reported on its own',
      auth,
      params: SandboxParams,
      body: ForkBody,
      audit: ({ params }) => ({ sandboxId: params.id }),
      async handler({ params, body, principal, signal }) {
        const source = liveSandbox(engine, principal.tenantId, params.id);
        const count = body?.count ?? 1;
        // The engine checks every slot first: a fork that would overshoot the quota makes nothing.
        const template = source.metadata[TEMPLATE_KEY];
        const result = await engine.fork(principal.tenantId, params.id, {
          count,
          ...(template !== undefined ? { metadata: { [TEMPLATE_KEY]: template } } : {}),
          signal,
          grants: { mountRoots: mountGrantOf(principal), diskQuotaBytes: principal.grants.diskQuotaBytes },
        });
        const failed = (code: string, message: string) => ({ error: { code: HTTP_STATUS[code as keyof typeof HTTP_STATUS] ?? 500, message } });
        const entries = await Promise.all(
          result.forks.map(async (fork) => {
            if ('error' in fork) return failed(fork.error.code, fork.error.message);
            if (body?.timeout === undefined) return { sandbox: sandboxBody(ctx, fork.sandbox) };
            try {
              return { sandbox: sandboxBody(ctx, engine.setTimeout(principal.tenantId, fork.sandbox.sandboxId, body.timeout * 1000)) };
            } catch (error) {
              // A fork the client is not told of would run unseen until its TTL: it goes.
              await engine.kill(principal.tenantId, fork.sandbox.sandboxId).catch(() => undefined);
              const cause = error instanceof SandboxError ? error : new SandboxError('INTERNAL', (error as Error).message);
              return failed(cause.code, `fork ${fork.sandbox.sandboxId} was made, but its timeout could not be set, so it was killed: ${cause.message}`);
            }
          }),
        );
        return { kind: 'json', status: 201, body: entries };
      },
    }),
    defineRoute({
      name: 'e2b.volumes.create',
      method: 'POST',
      url: '/volumes',
      summary: `E2B: a named volume (${E2B_VOLUME_BYTES / GiB} GiB, charged to the tenant's disk quota)`,
      auth,
      body: VolumeBody,
      audit: ({ body }) => ({ subject: body.name }),
      async handler({ body, principal }) {
        const info = await engine.createVolume(principal.tenantId, { name: body.name, sizeBytes: E2B_VOLUME_BYTES }, { quotaBytes: principal.grants.diskQuotaBytes });
        return { kind: 'json', status: 201, body: volumeBody(info) };
      },
    }),
    defineRoute({
      name: 'e2b.volumes.list',
      method: 'GET',
      url: '/volumes',
      summary: "E2B: the tenant's volumes",
      auth,
      async handler({ principal }) {
        const volumes = await engine.listVolumes(principal.tenantId);
        return { kind: 'json', status: 200, body: volumes.map((v) => ({ volumeID: v.volumeId, name: v.name })) };
      },
    }),
    defineRoute({
      name: 'e2b.volumes.get',
      method: 'GET',
      url: '/volumes/:volumeID',
      summary: 'E2B: a volume by id',
      auth,
      params: VolumeParams,
      async handler({ params, principal }) {
        return { kind: 'json', status: 200, body: volumeBody(await engine.getVolume(principal.tenantId, params.volumeID, 'id')) };
      },
    }),
    defineRoute({
      name: 'e2b.volumes.delete',
      method: 'DELETE',
      url: '/volumes/:volumeID',
      summary: 'E2B: delete a volume and its data (refused while a live sandbox mounts it)',
      auth,
      params: VolumeParams,
      audit: ({ params }) => ({ subject: params.volumeID }),
      async handler({ params, principal }) {
        await engine.deleteVolume(principal.tenantId, params.volumeID, 'id');
        return { kind: 'empty', status: 204 };
      },
    }),
  ];
}

/** The volume content API's operations (`Volume#list`, `readFile`, ...), by method and path. */
const VOLUME_CONTENT: { method: 'GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE'; path: string; call: string }[] = [
  { method: 'GET', path: 'dir', call: 'list' },
  { method: 'POST', path: 'dir', call: 'makeDir' },
  { method: 'GET', path: 'path', call: 'getInfo / exists' },
  { method: 'PATCH', path: 'path', call: 'updateMetadata' },
  { method: 'DELETE', path: 'path', call: 'remove' },
  { method: 'GET', path: 'file', call: 'readFile' },
  { method: 'PUT', path: 'file', call: 'writeFile' },
];

/**
 * E2B's volume content API (`/volumecontent/{volumeID}/...`, with the volume's token): refused by
 * name. Capsule writes a volume only through a sandbox that mounts it (its own uid, its own
 * mount namespace), never from the host on a tenant's behalf.
 */
export function volumeContentRoutes(ctx: E2bContext): AnyRoute[] {
  const auth: Authenticate = (request) => {
    const header = request.headers.authorization;
    const token = typeof header === 'string' && header.startsWith('Bearer ') ? header.slice('Bearer '.length).trim() : undefined;
    const { volumeID } = request.params as { volumeID?: string };
    const tenantId = volumeID === undefined ? undefined : ctx.tokens.tenantOf(token, volumeID);
    if (tenantId === undefined) {
      throw new SandboxError('UNAUTHENTICATED', 'the volume content API takes the volume\'s token (Authorization: Bearer …)', {
        hint: 'Get a volume with Volume.connect(volumeId) or Volume.create(name): it carries its token.',
      });
    }
    return { tenantId, keyId: 'e2b-volume-token', isAdmin: false, grants: { mountRoots: [] } };
  };
  return VOLUME_CONTENT.map(({ method, path, call }) =>
    defineRoute({
      name: `e2b.volumecontent.${path}`,
      method,
      url: `/volumecontent/:volumeID/${path}`,
      summary: `E2B: Volume#${call} (not supported)`,
      auth,
      params: VolumeParams,
      passThrough: true,
      handler() {
        throw new SandboxError('UNIMPLEMENTED', `Volume#${call} is not supported by Capsule's E2B facade: a volume's files are reached only from a sandbox that mounts it`, {
          details: { operation: call },
          hint: 'Mount the volume at create (Sandbox.create({ volumeMounts: { "/mnt/data": volume } })) and use sandbox.files on that path.',
        });
      },
    }),
  );
}

