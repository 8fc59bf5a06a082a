import { z } from 'zod';
import type { EngineCollectOptions } from '../../engine/types.js';
import {
  ArtifactCollectionSchema,
  ArtifactParams,
  CollectArtifactsBody,
  ErrorBodySchema,
  ListArtifactsQuery,
  SandboxIdParams,
  StoredArtifactSchema,
  type ArtifactCollection,
} from '../../wire/index.js';
import { defineRoute, type AnyRoute } from '../route.js';
import { requireSandbox, type ServerServices } from '../services.js';
import type { Principal } from '../auth.js';

const error = (description: string) => ({ description, schema: ErrorBodySchema });

/**
 * Collects a running sandbox's directory into the store (frozen copy; the engine counts each
 * outcome); a collection that does not fit the tenant's disk quota is refused (QUOTA_EXCEEDED)
 * before any copy.
 */
export async function collectFor(
  services: ServerServices,
  principal: Pick<Principal, 'tenantId' | 'grants'>,
  sandboxId: string,
  options: Omit<EngineCollectOptions, 'reserve'>,
): Promise<ArtifactCollection> {
  const { tenantId } = principal;
  const quota = services.diskQuota;
  const owner = { tenantId, quotaBytes: principal.grants.diskQuotaBytes };
  const { artifacts, truncated } = await services.engine.collectArtifacts(tenantId, sandboxId, {
    ...options,
    ...(quota ? { reserve: (bytes: number) => quota.reserveArtifacts(owner, bytes) } : {}),
  });
  return { artifacts, truncated };
}

/** Artifacts by reference: collect from a sandbox, then read, list and delete by sha256, per tenant. */
export function artifactRoutes(services: ServerServices): AnyRoute[] {
  if (!services.artifacts) return [];
  const store = services.artifacts;
  return [
    defineRoute({
      name: 'artifacts.collect',
      wakes: true,
      method: 'POST',
      url: '/v1/sandboxes/:sandboxId/artifacts',
      summary: 'Copy the files of a sandbox directory into the artifact store (sandbox frozen meanwhile)',
      auth: 'tenant',
      params: SandboxIdParams,
      body: CollectArtifactsBody.optional(),
      responses: {
        200: { description: 'One reference per file; skipped files say why', schema: ArtifactCollectionSchema },
        409: error('The sandbox is not running'),
        429: error("The files would not fit the tenant's disk quota (nothing was copied)"),
      },
      audit: ({ params, body }) => ({ sandboxId: params.sandboxId, subject: body?.dir ?? '/workspace/output' }),
      async handler({ params, body, principal, signal }) {
        requireSandbox(services, principal.tenantId, params.sandboxId);
        const collection = await collectFor(services, principal, params.sandboxId, { ...body, signal });
        return { kind: 'json', status: 200, body: collection };
      },
    }),
    defineRoute({
      name: 'artifacts.list',
      method: 'GET',
      url: '/v1/artifacts',
      summary: "List the tenant's artifacts, optionally of one sandbox (also ended ones)",
      auth: 'tenant',
      query: ListArtifactsQuery,
      responses: { 200: { description: 'Artifacts, oldest first', schema: z.object({ artifacts: z.array(StoredArtifactSchema) }) } },
      async handler({ query, principal }) {
        const artifacts = await store.list({ tenantId: principal.tenantId, sandboxId: query.sandboxId, limit: query.limit });
        return { kind: 'json', status: 200, body: { artifacts: artifacts.map(({ tenantId: _tenant, ...rest }) => rest) } };
      },
    }),
    defineRoute({
      name: 'artifacts.get',
      method: 'GET',
      url: '/v1/artifacts/:ref',
      summary: 'Download the bytes of an artifact by sha256 (or artifact id)',
      auth: 'tenant',
      params: ArtifactParams,
      responses: {
        200: { description: 'The stored bytes', contentType: 'application/octet-stream' },
        404: error('Unknown, expired, or collected by another tenant'),
      },
      async handler({ params, principal }) {
        const stream = await store.get(params.ref, { tenantId: principal.tenantId });
        return { kind: 'raw', status: 200, stream, contentType: 'application/octet-stream' };
      },
    }),
    defineRoute({
      name: 'artifacts.delete',
      method: 'DELETE',
      url: '/v1/artifacts/:ref',
      summary: "Delete the tenant's artifacts with this sha256 (or the one artifact id)",
      auth: 'tenant',
      params: ArtifactParams,
      responses: { 204: { description: 'Deleted' }, 404: error('Unknown, expired, or collected by another tenant') },
      audit: ({ params }) => ({ subject: params.ref }),
      async handler({ params, principal }) {
        await store.delete(params.ref, { tenantId: principal.tenantId });
        // What the tenant stores now, read back: a digest may have had several rows.
        services.diskQuota?.setStoredArtifacts(await store.bytesByTenant(principal.tenantId), [principal.tenantId]);
        return { kind: 'empty', status: 204 };
      },
    }),
  ];
}
