import { randomBytes } from 'node:crypto';
import type { Readable } from 'node:stream';
import Fastify, { type FastifyInstance, type FastifyServerOptions } from 'fastify';
import { z } from 'zod';
import { SandboxError } from '../errors/index.js';
import type { SandboxEngine } from '../engine/types.js';
import { ApiKeyStore, AuditLog, OperationStore, SqliteSandboxRecords, type SqliteDatabase } from '../store/index.js';
import { sendError } from './errors.js';
import { buildOpenApi } from './openapi.js';
import { TenantQuota } from './quota.js';
import { defineRoute, registerRoute, type AnyRoute } from './route.js';
import { fileRoutes } from './routes/files.js';
import { operatorRoutes } from './routes/operators.js';
import { processRoutes } from './routes/processes.js';
import { sandboxRoutes } from './routes/sandboxes.js';
import type { ServerServices } from './services.js';

export const API_VERSION = '0.1.0';
/** JSON bodies; file contents and stdin are streamed and bounded by the sandbox's limits. */
export const JSON_BODY_LIMIT_BYTES = 1024 * 1024;

export interface CapsuleAppOptions {
  engine: SandboxEngine;
  db: SqliteDatabase;
  /** Concurrent sandboxes per tenant, counting those still starting. @default 20 */
  maxSandboxesPerTenant?: number;
  /** Fastify's pino logger options. @default false */
  logger?: FastifyServerOptions['logger'];
  now?: () => number;
}

/**
 * The HTTP application: Fastify with the v1 routes, one error shape, and the seam that
 * authenticates, validates, deduplicates and audits every call. `close()` stops accepting,
 * ends the engine's sandboxes, and finishes open streams; the caller owns the database.
 */
export class CapsuleApp {
  readonly app: FastifyInstance;
  readonly services: ServerServices;
  readonly routes: AnyRoute[];
  private readonly closeController = new AbortController();
  private closing: Promise<void> | undefined;

  constructor(options: CapsuleAppOptions) {
    const now = options.now ?? Date.now;
    const records = new SqliteSandboxRecords(options.db);
    this.services = {
      engine: options.engine,
      records,
      keys: new ApiKeyStore(options.db, now),
      operations: new OperationStore(options.db, now),
      audit: new AuditLog(options.db, now),
      quota: new TenantQuota(options.maxSandboxesPerTenant ?? 20, (tenantId) => records.countLive(tenantId)),
      closeSignal: this.closeController.signal,
    };
    this.app = Fastify({
      logger: options.logger ?? false,
      bodyLimit: JSON_BODY_LIMIT_BYTES,
      // Request ids are ours: a client-sent X-Request-Id is not trusted into the logs.
      requestIdHeader: false,
      genReqId: () => `req_${randomBytes(8).toString('hex')}`,
      return503OnClosing: true,
    });
    this.routes = [
      ...sandboxRoutes(this.services),
      ...processRoutes(this.services),
      ...fileRoutes(this.services),
      ...operatorRoutes(this.services),
    ];
    let openapi: object | undefined;
    this.routes.push(
      defineRoute({
        name: 'openapi',
        method: 'GET',
        url: '/openapi.json',
        summary: 'This OpenAPI 3.1 document',
        auth: 'none',
        responses: { 200: { description: 'OpenAPI 3.1', schema: z.object({ openapi: z.string() }).loose() } },
        handler: () => ({ kind: 'json', status: 200, body: (openapi ??= buildOpenApi(this.routes, API_VERSION)) }),
      }),
    );
    // TODO(metrics): GET /metrics is served by src/metrics/ (loopback only); it registers here.
    this.configure();
  }

  private configure(): void {
    const { app } = this;
    // Raw bodies (file uploads, stdin) are handed to the route as the request stream, unread.
    app.removeContentTypeParser('text/plain');
    app.addContentTypeParser('application/octet-stream', (_request, payload, done) => done(null, payload as Readable));
    app.addContentTypeParser('*', (_request, payload, done) => done(null, payload as Readable));
    app.addHook('onRequest', async (request, reply) => {
      reply.header('x-request-id', request.id);
    });
    app.setErrorHandler((error, request, reply) => sendError(request, reply, error));
    app.setNotFoundHandler((request, reply) =>
      sendError(
        request,
        reply,
        new SandboxError('NOT_FOUND', `no route ${request.method} ${request.url.split('?')[0] ?? ''}`, {
          details: { method: request.method },
          hint: 'See GET /openapi.json for the routes.',
        }),
      ),
    );
    for (const route of this.routes) registerRoute(app, this.services, route);
  }

  /** Listens and returns the base URL. */
  async listen(port: number, host: string): Promise<string> {
    await this.app.listen({ port, host });
    const address = this.app.server.address();
    const bound = typeof address === 'object' && address ? address.port : port;
    return `http://${host.includes(':') ? `[${host}]` : host}:${bound}`;
  }

  /**
   * Graceful stop: new requests get 503, the engine kills its sandboxes (foreground streams end
   * with their exit), then streams that never end by themselves (watch, reattach) are ended.
   */
  close(options: { forceAfterMs?: number } = {}): Promise<void> {
    this.closing ??= (async () => {
      const appClosed = this.app.close();
      try {
        await this.services.engine.close();
      } finally {
        this.closeController.abort();
        const force = setTimeout(() => this.app.server.closeAllConnections(), options.forceAfterMs ?? 5000);
        try {
          await appClosed;
        } finally {
          clearTimeout(force);
        }
      }
    })();
    return this.closing;
  }
}
