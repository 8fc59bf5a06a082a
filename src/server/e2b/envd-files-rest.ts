import { Readable } from 'node:stream';
import { createGunzip } from 'node:zlib';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { z } from 'zod';
import { SandboxError } from '../../errors/index.js';
import type { FileEntry } from '../../wire/index.js';
import { sendError } from '../errors.js';
import { defineRoute, registerRoute, type AnyRoute, httpOnly, type RouteContext } from '../route.js';
import { envdPrincipal, sandboxOf, type SignedQuery } from './access.js';
import { ConnectError, plainError } from './connect-protocol.js';
import { envdTraffic, type E2bContext, type PortConstraint } from './deps.js';
import { checkUser, toE2bPath, toSandboxPath } from './paths.js';

/** envd's plain HTTP endpoints: `GET/POST /files` and `GET /health`. */

const FilesQuery = z.object({
  path: z.string().optional(),
  username: z.string().optional(),
  signature: z.string().optional(),
  signature_expiration: z.string().optional(),
});

/** envd's REST errors: `{code, message}` with the status the SDK maps (404 → FileNotFoundError). */
function sendRestError(request: FastifyRequest, reply: FastifyReply, error: unknown): FastifyReply {
  // Without routing headers only a signed URL is an envd call; anything else has no route here.
  if (isUnrouted(request)) return sendError(request, reply, error);
  const directory = new Set(['IS_A_DIRECTORY', 'NOT_A_DIRECTORY', 'INVALID_PATH']);
  const { status, message } = plainError(error, (code, status) => (directory.has(code) ? 400 : status));
  if (status >= 500 && status !== 507) request.log.error({ err: error }, 'envd /files call failed');
  return reply.code(status).type('application/json').send({ code: status, message });
}

function isUnrouted(request: FastifyRequest): boolean {
  const query = request.query as SignedQuery | undefined;
  return request.headers['e2b-sandbox-port'] === undefined && query?.signature === undefined;
}

function written(entry: FileEntry): object {
  return { path: toE2bPath(entry.path), name: entry.name, type: 'file' };
}

/**
 * `/files` and `/health` in their own scope: envd's REST error shape, multipart uploads. Through
 * the seam like every call: authenticated by an access token or a signed URL, uploads audited.
 */
export function registerEnvdFilesRest(app: FastifyInstance, ctx: E2bContext, constraints: PortConstraint): void {
  app.setErrorHandler((error, request, reply) => sendRestError(request, reply, error));
  for (const route of filesRestRoutes(ctx, constraints)) registerRoute(app, ctx, envdTraffic(route));
}

function filesRestRoutes(ctx: E2bContext, constraints: PortConstraint): AnyRoute[] {
  const { engine, tokens } = ctx;
  /** The access token, or else a signed URL's signature (`uploadUrl()`/`downloadUrl()`). */
  const auth = (operation: 'read' | 'write') => (request: FastifyRequest) => {
    if (isUnrouted(request)) {
      throw new SandboxError('NOT_FOUND', `no route ${request.method} /files`, { hint: 'See GET /openapi.json for the routes.' });
    }
    checkUser(request);
    const query = request.query as SignedQuery;
    if (query.signature === undefined || request.headers['x-access-token'] !== undefined) return envdPrincipal(tokens.verify(request));
    const named = request.headers['e2b-sandbox-id'];
    const candidates = ctx.records
      .listLive()
      .filter((info) => typeof named !== 'string' || info.sandboxId === named)
      .map((info) => ({ tenantId: info.tenantId, sandboxId: info.sandboxId }));
    return envdPrincipal(tokens.verifySignature(query, operation, candidates));
  };

  const read = (routed: boolean) =>
    defineRoute({
      name: 'e2b.files.read',
      method: 'GET',
      url: '/files',
      summary: 'envd: read a file',
      auth: auth('read'),
      ...(routed ? { constraints } : {}),
      query: FilesQuery,
      async handler({ principal, query }) {
        const access = sandboxOf(principal);
        const stream = await engine.files(access.tenantId, access.sandboxId).read(toSandboxPath(query.path));
        return { kind: 'raw', status: 200, stream, contentType: 'application/octet-stream' };
      },
    });

  const upload = (routed: boolean) =>
    defineRoute({
      name: 'e2b.files.write',
      method: 'POST',
      url: '/files',
      summary: 'envd: upload files',
      auth: auth('write'),
      ...(routed ? { constraints } : {}),
      query: FilesQuery,
      rawBody: true,
      audit: ({ principal, query }: RouteContext<unknown, z.infer<typeof FilesQuery>, Readable>) => ({ sandboxId: principal.sandboxId, subject: query.path ?? '(multipart)' }),
      async handler({ principal, query, body, request: maybeHttp }) {
        const request = httpOnly(maybeHttp);
        const access = sandboxOf(principal);
        const files = engine.files(access.tenantId, access.sandboxId);
        const entries: object[] = [];
        if (request.isMultipart()) {
          for await (const part of request.files()) {
            const target = query.path ?? part.filename;
            if (!target) throw new ConnectError('invalid_argument', 'each file part needs a filename when no path is given');
            entries.push(written(await files.write(toSandboxPath(target), part.file)));
          }
        } else {
          const encoding = String(request.headers['content-encoding'] ?? '').toLowerCase();
          if (encoding !== '' && encoding !== 'identity' && encoding !== 'gzip') {
            throw new ConnectError('invalid_argument', `Content-Encoding ${encoding} is not supported; use gzip or none`);
          }
          const data = encoding === 'gzip' ? body.pipe(createGunzip()) : body;
          entries.push(written(await files.write(toSandboxPath(query.path), data)));
        }
        if (entries.length === 0) throw new ConnectError('invalid_argument', 'no file was sent: use multipart parts named "file" or an application/octet-stream body');
        return { kind: 'json', status: 200, body: entries };
      },
    });

  return [
    read(true),
    upload(true),
    // Signed URLs carry no routing headers (the SDK builds them from sandboxUrl alone).
    read(false),
    upload(false),
    defineRoute({
      name: 'e2b.health',
      method: 'GET',
      url: '/health',
      summary: 'envd: 204 while the sandbox runs; 502 (what E2B\'s proxy answers) when it is paused or gone',
      auth: 'none',
      constraints,
      handler({ request: maybeHttp }) {
        const request = httpOnly(maybeHttp);
        let running = false;
        try {
          const access = tokens.verify(request);
          running = engine.get(access.tenantId, access.sandboxId).state === 'running';
        } catch {
          running = false;
        }
        if (running) return { kind: 'empty', status: 204 };
        const sandboxId = request.headers['e2b-sandbox-id'];
        return { kind: 'json', status: 502, body: { message: 'The sandbox was not found', sandboxId: typeof sandboxId === 'string' ? sandboxId : '', code: 502 } };
      },
    }),
  ];
}
