import { defineRoute, type AnyRoute } from '../route.js';
import { CreateVolumeBody, ErrorBodySchema, VolumeInfoSchema, VolumeListSchema, VolumeNameParams } from '../../wire/index.js';
import type { ServerServices } from '../services.js';

const error = (description: string) => ({ description, schema: ErrorBodySchema });

/** Named volumes of a tenant (`/v1/volumes`), mounted into sandboxes by `spec.volumes`. */
export function volumeRoutes(services: ServerServices): AnyRoute[] {
  const { engine } = services;
  return [
    defineRoute({
      name: 'volumes.create',
      method: 'POST',
      url: '/v1/volumes',
      summary: 'Create a named volume with a size limit; it outlives sandboxes and server restarts',
      auth: 'tenant',
      body: CreateVolumeBody,
      responses: {
        201: { description: 'The volume', schema: VolumeInfoSchema },
        400: error('A bad body, or (from) a size below what the copy holds (INVALID_ARGUMENT)'),
        404: error('No such snapshot, or it kept no copy of that volume (SNAPSHOT_NOT_FOUND, VOLUME_NOT_FOUND)'),
        409: error('The tenant has a volume of this name (ALREADY_EXISTS), or the snapshot is being deleted (CONFLICT)'),
        429: error("Its size does not fit the tenant's disk quota (QUOTA_EXCEEDED)"),
      },
      async handler({ body, principal }) {
        const info = await engine.createVolume(principal.tenantId, body, { quotaBytes: principal.grants.diskQuotaBytes });
        return { kind: 'json', status: 201, body: info };
      },
    }),
    defineRoute({
      name: 'volumes.list',
      method: 'GET',
      url: '/v1/volumes',
      summary: 'List your volumes with what each holds',
      auth: 'tenant',
      responses: { 200: { description: 'The volumes', schema: VolumeListSchema } },
      handler: async ({ principal }) => ({ kind: 'json', status: 200, body: { volumes: await engine.listVolumes(principal.tenantId) } }),
    }),
    defineRoute({
      name: 'volumes.get',
      method: 'GET',
      url: '/v1/volumes/:name',
      summary: 'A volume with what it holds',
      auth: 'tenant',
      params: VolumeNameParams,
      responses: { 200: { description: 'The volume', schema: VolumeInfoSchema }, 404: error('No such volume') },
      handler: async ({ params, principal }) => ({ kind: 'json', status: 200, body: await engine.getVolume(principal.tenantId, params.name) }),
    }),
    defineRoute({
      name: 'volumes.delete',
      method: 'DELETE',
      url: '/v1/volumes/:name',
      summary: 'Delete a volume and its data (refused while a live sandbox mounts it)',
      auth: 'tenant',
      params: VolumeNameParams,
      responses: { 204: { description: 'Deleted' }, 404: error('No such volume'), 409: error('Live sandboxes mount it') },
      async handler({ params, principal }) {
        await engine.deleteVolume(principal.tenantId, params.name);
        return { kind: 'empty', status: 204 };
      },
    }),
  ];
}
