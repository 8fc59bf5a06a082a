import type { Readable } from 'node:stream';
import { z } from 'zod';
import { defineRoute, type AnyRoute } from '../route.js';
import { ErrorBodySchema, FileEntrySchema, ListFilesQuery, MkdirBody, MoveBody, PathQuery, SandboxIdParams, WatchEventSchema, WatchQuery } from '../../wire/index.js';
import { requireSandbox, type ServerServices } from '../services.js';

const error = (description: string) => ({ description, schema: ErrorBodySchema });

/** File routes: paths as the sandbox sees them; the engine's file service does the work. */
export function fileRoutes(services: ServerServices): AnyRoute[] {
  const files = (tenantId: string, sandboxId: string) => {
    requireSandbox(services, tenantId, sandboxId);
    return services.engine.files(tenantId, sandboxId);
  };
  return [
    defineRoute({
      name: 'files.read',
      wakes: true,
      method: 'GET',
      url: '/v1/sandboxes/:sandboxId/files',
      summary: 'Read a file (raw bytes, streamed)',
      auth: 'tenant',
      params: SandboxIdParams,
      query: PathQuery,
      responses: { 200: { description: 'The bytes', contentType: 'application/octet-stream' }, 404: error('No such file') },
      audit: ({ params, query }) => ({ sandboxId: params.sandboxId, subject: query.path }),
      async handler({ params, query, principal, signal }) {
        const stream = await files(principal.tenantId, params.sandboxId).read(query.path, { signal });
        return { kind: 'raw', status: 200, stream, contentType: 'application/octet-stream' };
      },
    }),
    defineRoute({
      name: 'files.write',
      wakes: true,
      method: 'PUT',
      url: '/v1/sandboxes/:sandboxId/files',
      summary: 'Write a file atomically (raw bytes, streamed; parents are created)',
      auth: 'tenant',
      params: SandboxIdParams,
      query: PathQuery,
      rawBody: true,
      responses: {
        200: { description: 'The written file', schema: FileEntrySchema },
        413: error('Larger than the sandbox file-size limit'),
        507: error('The workspace disk limit is reached'),
      },
      audit: ({ params, query }) => ({ sandboxId: params.sandboxId, subject: query.path }),
      async handler({ params, query, principal, body, signal }) {
        const entry = await files(principal.tenantId, params.sandboxId).write(query.path, body as Readable, { signal });
        return { kind: 'json', status: 200, body: entry };
      },
    }),
    defineRoute({
      name: 'files.list',
      wakes: true,
      method: 'GET',
      url: '/v1/sandboxes/:sandboxId/files/list',
      summary: 'List a directory',
      auth: 'tenant',
      params: SandboxIdParams,
      query: ListFilesQuery,
      responses: { 200: { description: 'Entries', schema: z.object({ entries: z.array(FileEntrySchema) }) } },
      handler: async ({ params, query, principal }) => ({
        kind: 'json',
        status: 200,
        body: { entries: await files(principal.tenantId, params.sandboxId).list(query.path, query.depth) },
      }),
    }),
    defineRoute({
      name: 'files.stat',
      wakes: true,
      method: 'GET',
      url: '/v1/sandboxes/:sandboxId/files/stat',
      summary: 'Describe a file or directory',
      auth: 'tenant',
      params: SandboxIdParams,
      query: PathQuery,
      responses: { 200: { description: 'The entry', schema: FileEntrySchema }, 404: error('No such file') },
      handler: async ({ params, query, principal }) => ({
        kind: 'json',
        status: 200,
        body: await files(principal.tenantId, params.sandboxId).stat(query.path),
      }),
    }),
    defineRoute({
      name: 'files.mkdir',
      wakes: true,
      method: 'POST',
      url: '/v1/sandboxes/:sandboxId/files/mkdir',
      summary: 'Create a directory (and its parents)',
      auth: 'tenant',
      params: SandboxIdParams,
      body: MkdirBody,
      responses: { 201: { description: 'The directory', schema: FileEntrySchema } },
      audit: ({ params, body }) => ({ sandboxId: params.sandboxId, subject: body.path }),
      handler: async ({ params, body, principal }) => ({
        kind: 'json',
        status: 201,
        body: await files(principal.tenantId, params.sandboxId).mkdir(body.path),
      }),
    }),
    defineRoute({
      name: 'files.move',
      wakes: true,
      method: 'POST',
      url: '/v1/sandboxes/:sandboxId/files/move',
      summary: 'Move or rename a file or directory',
      auth: 'tenant',
      params: SandboxIdParams,
      body: MoveBody,
      responses: { 200: { description: 'The entry at its destination', schema: FileEntrySchema } },
      audit: ({ params, body }) => ({ sandboxId: params.sandboxId, subject: JSON.stringify([body.source, body.destination]) }),
      handler: async ({ params, body, principal }) => ({
        kind: 'json',
        status: 200,
        body: await files(principal.tenantId, params.sandboxId).move(body.source, body.destination),
      }),
    }),
    defineRoute({
      name: 'files.remove',
      wakes: true,
      method: 'DELETE',
      url: '/v1/sandboxes/:sandboxId/files',
      summary: 'Remove a file or directory (recursively)',
      auth: 'tenant',
      params: SandboxIdParams,
      query: PathQuery,
      responses: { 204: { description: 'Removed' }, 404: error('No such file') },
      audit: ({ params, query }) => ({ sandboxId: params.sandboxId, subject: query.path }),
      async handler({ params, query, principal }) {
        await files(principal.tenantId, params.sandboxId).remove(query.path);
        return { kind: 'empty', status: 204 };
      },
    }),
    defineRoute({
      name: 'files.watch',
      wakes: true,
      method: 'GET',
      url: '/v1/sandboxes/:sandboxId/files/watch',
      summary: 'Watch a directory: NDJSON WatchEvents until the client goes away',
      auth: 'tenant',
      params: SandboxIdParams,
      query: WatchQuery,
      responses: { 200: { description: 'NDJSON WatchEvents', schema: WatchEventSchema, contentType: 'application/x-ndjson' } },
      audit: ({ params, query }) => ({ sandboxId: params.sandboxId, subject: query.path }),
      handler: ({ params, query, principal, signal }) => ({
        kind: 'ndjson',
        status: 200,
        events: files(principal.tenantId, params.sandboxId).watch(query.path, { recursive: query.recursive ?? false, signal }),
      }),
    }),
  ];
}
