import { z } from 'zod';
import { collectArtifacts, type Collection, type CollectOptions } from '../../engine/artifacts.js';
import type { BackendSandbox } from '../../backends/backend.js';
import { SandboxError } from '../../errors/index.js';
import type { ArtifactStore } from '../../store/artifacts/index.js';
import { SANDBOX_ID_PATTERN } from '../../engine/ids.js';
import { defineRoute, type AnyRoute } from '../route.js';
import { ErrorBodySchema, SandboxIdParams, SandboxPath } from '../schemas.js';
import { requireSandbox, type ServerServices } from '../services.js';
import type { Principal } from '../auth.js';

const error = (description: string) => ({ description, schema: ErrorBodySchema });
const GiB = 1024 * 1024 * 1024;

export const CollectArtifactsBody = z.strictObject({
  dir: SandboxPath.optional().meta({ description: 'Sandbox directory under /workspace. Default /workspace/output' }),
  maxFileBytes: z.number().int().positive().max(GiB).optional().meta({ description: 'A larger file is skipped (too_large). Default 64 MiB' }),
  maxTotalBytes: z.number().int().positive().max(4 * GiB).optional().meta({ description: 'Files past this total are skipped (total_cap). Default 128 MiB' }),
});
export type CollectArtifactsRequest = z.infer<typeof CollectArtifactsBody>;

const ArtifactRefSchema = z.object({
  name: z.string(),
  path: z.string(),
  size: z.number().optional(),
  sha256: z.string().optional(),
  uri: z.string().optional(),
  id: z.string().optional(),
  expiresAt: z.string().optional(),
  skipped: z.enum(['too_large', 'total_cap', 'symlink', 'special', 'changing', 'verify_failed']).optional(),
});
const CollectionSchema = z.object({ artifacts: z.array(ArtifactRefSchema), truncated: z.boolean() });
const ArtifactSchema = z.object({
  id: z.string(),
  name: z.string(),
  path: z.string(),
  size: z.number(),
  sha256: z.string(),
  uri: z.string(),
  sandboxId: z.string(),
  createdAt: z.string(),
  expiresAt: z.string(),
});

const ArtifactParams = z.strictObject({ ref: z.string().regex(/^(?:[0-9a-f]{64}|art_[0-9a-z]{20})$/, 'must be a sha256 or an artifact id') });
const ListArtifactsQuery = z.strictObject({
  sandboxId: z.string().regex(SANDBOX_ID_PATTERN, 'must be a sandbox id').optional(),
  limit: z.string().regex(/^\d{1,4}$/, 'must be a number').transform(Number).pipe(z.number().int().min(1).max(1000)).optional(),
});

function requireStore(services: ServerServices): ArtifactStore {
  if (!services.artifacts) throw new SandboxError('UNIMPLEMENTED', 'this server has no artifact store configured');
  return services.artifacts;
}

function liveSandbox(services: ServerServices, tenantId: string, sandboxId: string): BackendSandbox {
  const engine = services.engine as { backendSandbox?(tenantId: string, sandboxId: string): BackendSandbox };
  if (!engine.backendSandbox) throw new SandboxError('UNIMPLEMENTED', 'this engine cannot collect artifacts');
  return engine.backendSandbox(tenantId, sandboxId);
}

/**
 * Collects a running sandbox's directory into the store (frozen copy), counting each outcome; a
 * collection that does not fit the tenant's disk quota is refused (QUOTA_EXCEEDED) before any copy.
 */
export async function collectFor(
  services: ServerServices,
  principal: Pick<Principal, 'tenantId' | 'diskQuotaBytes'>,
  sandboxId: string,
  options: Pick<CollectOptions, 'dir' | 'maxFileBytes' | 'maxTotalBytes' | 'signal'>,
): Promise<Omit<Collection, 'deliveredBytes'>> {
  const store = requireStore(services);
  const { tenantId } = principal;
  const sandbox = liveSandbox(services, tenantId, sandboxId);
  const quota = services.diskQuota;
  const { artifacts, truncated } = await collectArtifacts(sandbox, store, {
    ...options,
    tenantId,
    onOutcome: (outcome) => services.metrics?.recordArtifact(outcome),
    ...(quota ? { reserve: (bytes: number) => quota.reserveArtifacts({ tenantId, quotaBytes: principal.diskQuotaBytes }, bytes) } : {}),
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
      method: 'POST',
      url: '/v1/sandboxes/:sandboxId/artifacts',
      summary: 'Copy the files of a sandbox directory into the artifact store (sandbox frozen meanwhile)',
      auth: 'tenant',
      params: SandboxIdParams,
      body: CollectArtifactsBody.optional(),
      responses: {
        200: { description: 'One reference per file; skipped files say why', schema: CollectionSchema },
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
      responses: { 200: { description: 'Artifacts, oldest first', schema: z.object({ artifacts: z.array(ArtifactSchema) }) } },
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
