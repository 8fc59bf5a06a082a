import { Readable } from 'node:stream';
import { createGunzip } from 'node:zlib';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { SandboxAccess, SignedQuery } from './access.js';
import { SandboxError, isSandboxError } from '../../errors/index.js';
import { sendError } from '../errors.js';
import type { FileEntry } from '../../wire/index.js';
import { audited } from './audit.js';
import { ConnectError, connectStatus } from './connect-protocol.js';
import type { E2bContext, PortConstraint } from './deps.js';
import { checkUser, toE2bPath, toSandboxPath } from './paths.js';

/** envd's plain HTTP endpoints: `GET/POST /files` and `GET /health`. */

type FilesRequest = FastifyRequest<{ Querystring: SignedQuery }>;

/** envd's REST errors: `{code, message}` with the status the SDK maps (404 → FileNotFoundError). */
function sendRestError(request: FastifyRequest, reply: FastifyReply, error: unknown): FastifyReply {
  let status = 500;
  let message = 'internal error in the Capsule E2B facade; the server log has the details';
  if (error instanceof ConnectError) {
    status = connectStatus(error.code);
    message = error.message;
  } else if (isSandboxError(error)) {
    status = error.code === 'IS_A_DIRECTORY' || error.code === 'NOT_A_DIRECTORY' || error.code === 'INVALID_PATH' ? 400 : error.status;
    message = [error.message, error.hint].filter(Boolean).join('. ');
  } else if (typeof (error as { statusCode?: unknown }).statusCode === 'number') {
    status = (error as { statusCode: number }).statusCode;
    message = (error as Error).message;
  }
  if (status >= 500 && status !== 507) request.log.error({ err: error }, 'envd /files call failed');
  return reply.code(status).type('application/json').send({ code: status, message });
}

function written(entry: FileEntry): object {
  return { path: toE2bPath(entry.path), name: entry.name, type: 'file' };
}

export function registerEnvdFilesRest(app: FastifyInstance, ctx: E2bContext, constraints: PortConstraint): void {
  const { engine, tokens } = ctx;
  /** The access token, or else a signed URL's signature (`uploadUrl()`/`downloadUrl()`). */
  const accessOf = (request: FilesRequest, operation: 'read' | 'write'): SandboxAccess => {
    checkUser(request);
    if (request.query.signature === undefined || request.headers['x-access-token'] !== undefined) return tokens.verify(request);
    const named = request.headers['e2b-sandbox-id'];
    const candidates = (ctx.records?.listLive() ?? [])
      .filter((info) => typeof named !== 'string' || info.sandboxId === named)
      .map((info) => ({ tenantId: info.tenantId, sandboxId: info.sandboxId }));
    return tokens.verifySignature(request.query, operation, candidates);
  };

  /** Without routing headers only a signed URL is an envd call; anything else has no route here. */
  const unrouted = (request: FilesRequest, reply: FastifyReply): FastifyReply | undefined => {
    if (request.headers['e2b-sandbox-port'] !== undefined || request.query.signature !== undefined) return undefined;
    return sendError(request, reply, new SandboxError('NOT_FOUND', `no route ${request.method} /files`, { hint: 'See GET /openapi.json for the routes.' }));
  };

  const read = async (request: FilesRequest, reply: FastifyReply) => {
    const answered = unrouted(request, reply);
    if (answered) return answered;
    try {
      const access = accessOf(request, 'read');
      const stream = await engine.files(access.tenantId, access.sandboxId).read(toSandboxPath(request.query.path));
      return await reply.code(200).type('application/octet-stream').send(stream);
    } catch (error) {
      return sendRestError(request, reply, error);
    }
  };

  const upload = async (request: FilesRequest, reply: FastifyReply) => {
    const answered = unrouted(request, reply);
    if (answered) return answered;
    try {
      const access = accessOf(request, 'write');
      const files = engine.files(access.tenantId, access.sandboxId);
      const write = (path: string, data: Readable) => audited(ctx, request, access, 'files.write', { subject: path }, () => files.write(path, data));
      const entries: object[] = [];
      if (request.isMultipart()) {
        for await (const part of request.files()) {
          const target = request.query.path ?? part.filename;
          if (!target) throw new ConnectError('invalid_argument', 'each file part needs a filename when no path is given');
          entries.push(written(await write(toSandboxPath(target), part.file)));
        }
      } else {
        const body = request.body instanceof Readable ? request.body : Readable.from([]);
        const encoding = String(request.headers['content-encoding'] ?? '').toLowerCase();
        if (encoding !== '' && encoding !== 'identity' && encoding !== 'gzip') {
          throw new ConnectError('invalid_argument', `Content-Encoding ${encoding} is not supported; use gzip or none`);
        }
        const data = encoding === 'gzip' ? body.pipe(createGunzip()) : body;
        entries.push(written(await write(toSandboxPath(request.query.path), data)));
      }
      if (entries.length === 0) throw new ConnectError('invalid_argument', 'no file was sent: use multipart parts named "file" or an application/octet-stream body');
      return await reply.code(200).send(entries);
    } catch (error) {
      return sendRestError(request, reply, error);
    }
  };

  app.get('/files', { constraints }, read);
  app.post('/files', { constraints }, upload);
  // Signed URLs carry no routing headers (the SDK builds them from sandboxUrl alone).
  app.get('/files', read);
  app.post('/files', upload);

  /** 204 while the sandbox runs; 502 (what E2B's proxy answers) when it is paused or gone. */
  app.get('/health', { constraints }, async (request, reply) => {
    let running = false;
    try {
      const access = tokens.verify(request);
      running = engine.get(access.tenantId, access.sandboxId).state === 'running';
    } catch {
      running = false;
    }
    if (running) return reply.code(204).send();
    const sandboxId = request.headers['e2b-sandbox-id'];
    return reply.code(502).send({ message: 'The sandbox was not found', sandboxId: typeof sandboxId === 'string' ? sandboxId : '', code: 502 });
  });
}
