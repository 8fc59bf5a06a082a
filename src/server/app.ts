import { createHmac } from 'node:crypto';
import type { Duplex, Readable } from 'node:stream';
import Fastify, { type FastifyInstance, type FastifyServerOptions } from 'fastify';
import { z } from 'zod';
import { SandboxError } from '../errors/index.js';
import type { EngineCloseOptions, SandboxEngine } from '../engine/types.js';
import { ApiKeyStore, atomically, AuditLog, OperationStore, SqliteSandboxRecords, type SqliteDatabase } from '../store/index.js';
import { registerE2bFacade } from './e2b/index.js';
import { EnvdTokens } from './e2b/access.js';
import { PortUrlSigner } from './ports/port-access.js';
import { PortConnectionPool } from './ports/port-pool.js';
import { hostRouting, portUrlRoutes, registerPortRoutes } from './ports/port-routes.js';
import { sendError } from './errors.js';
import { buildOpenApi } from './openapi.js';
import { FairTurns } from './fair-turns.js';
import { defineRoute, JSON_BODY_LIMIT_BYTES, registerRoute, type AnyRoute } from './route.js';
import { newRequestId, SeamCalls } from './in-process.js';
import { fileRoutes } from './routes/files.js';
import { networkRoutes } from './routes/network.js';
import { pauseRoutes } from './routes/pause.js';
import { snapshotRoutes } from './routes/snapshots.js';
import { volumeRoutes } from './routes/volumes.js';
import { artifactRoutes } from './routes/artifacts.js';
import { codeRoutes } from './routes/code.js';
import { metricsRoutes, recordRequests } from './routes/metrics.js';
import { operatorRoutes } from './routes/operators.js';
import { processRoutes } from './routes/processes.js';
import { sandboxRoutes } from './routes/sandboxes.js';
import { capacityRoutes } from './routes/capacity.js';
import { usageRoutes } from './routes/usage.js';
import { templateRoutes } from './routes/templates.js';
import { adminRoutes } from './routes/admin.js';
import { liveRoutes } from './routes/live.js';
import { sessionRoutes } from './routes/sessions.js';
import type { ConsoleSessions } from './console/sessions.js';
import type { SandboxFeed } from './console/sandbox-feed.js';
import { registerConsoleUi } from './console/static-ui.js';
import type { ServerServices } from './services.js';

export const API_VERSION = '0.1.0';

export interface CapsuleAppOptions {
  engine: SandboxEngine;
  db: SqliteDatabase;
  /** Fastify's pino logger options. @default false */
  logger?: FastifyServerOptions['logger'];
  now?: () => number;
  /**
   * More routes on the same server (the E2B facade, /metrics): called once the v1 routes are
   * registered, with the same services. They share the error handler and the raw-body parsers.
   */
  extensions?: ((app: FastifyInstance, services: ServerServices) => void)[];
  /**
   * The instance's token key (`<dataDir>/keys/tokens.key`): envd access tokens, signed file URLs
   * and signed port URLs are made with keys derived from it, so they stay valid across restarts.
   * @default a random key per app (tokens die with it)
   */
  tokenKey?: Buffer;
  /** Metrics, artifacts, usage samples and output logs; each adds its routes when present. */
  observability?: Pick<ServerServices, 'metrics' | 'artifacts' | 'processLogs' | 'diskQuota'>;
  /** Templates and their builds (/v1/templates). @default none: the routes are not there */
  templates?: ServerServices['templates'];
  /**
   * With a domain D whose wildcard `*.D` points at this server, port P of sandbox ID is also
   * `http://P-ID.D/` (routing by the Host header; E2B's `getHost`). @default none
   */
  publicDomain?: string;
  /** What the web console (and any client) uses beyond the sandbox API; see docs/console.md. */
  console?: ConsoleOptions;
  /**
   * Synchronous time spent starting requests per event-loop turn before the rest wait, first
   * come first served (src/server/fair-turns.ts); 0 starts every request at once, as it is read.
   * @default 2
   */
  fairTurnBudgetMs?: number;
}

export interface ConsoleOptions {
  /** Session keys and login tokens: POST /v1/sessions and /v1/sessions/login when present. */
  sessions?: ConsoleSessions;
  /** The feed of sandbox changes (GET /v1/sandboxes/events); it must observe the engine's record store. */
  feed?: SandboxFeed;
  /** The data directory, for the host capacity in GET /v1/admin/metrics. */
  dataDir?: string;
  /** Where the built console is. @default dist/console under the package root */
  uiDir?: string;
}

/** One key per use from the instance's token key, so a token of one kind is never valid as another. */
function derivedKey(key: Buffer, purpose: string): Buffer {
  return createHmac('sha256', key).update(`capsule-token-key\0${purpose}`).digest();
}

/** A request Node's HTTP parser refused (bad headers, too large): answered on the socket. */
function rejectMalformedRequest(error: Error & { code?: string }, socket: Duplex): void {
  if (!socket.writable) {
    socket.destroy();
    return;
  }
  const tooLarge = error.code === 'HPE_HEADER_OVERFLOW';
  const body = JSON.stringify({
    code: tooLarge ? 'PAYLOAD_TOO_LARGE' : 'INVALID_ARGUMENT',
    message: tooLarge ? 'the request headers are too large' : 'the HTTP request is malformed',
    details: { field: 'request' },
    requestId: newRequestId(),
  });
  const status = tooLarge ? '431 Request Header Fields Too Large' : '400 Bad Request';
  socket.end(`HTTP/1.1 ${status}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`);
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
  /** Settles when each open response has ended; close() waits for them before dropping connections. */
  private readonly inFlight = new Set<Promise<void>>();
  private readonly fairTurnBudgetMs: number;

  constructor(options: CapsuleAppOptions) {
    const now = options.now ?? Date.now;
    this.fairTurnBudgetMs = options.fairTurnBudgetMs ?? 2;
    const records = new SqliteSandboxRecords(options.db);
    this.services = {
      engine: options.engine,
      records,
      keys: new ApiKeyStore(options.db, now),
      operations: new OperationStore(options.db, now),
      audit: new AuditLog(options.db, now),
      closeSignal: this.closeController.signal,
      atomically: atomically(options.db),
      wake: (tenantId, sandboxId) => options.engine.wake(tenantId, sandboxId),
      calls: new SeamCalls(),
      accessTokens: new EnvdTokens(options.tokenKey && derivedKey(options.tokenKey, 'envd-access-token')),
      portUrls: new PortUrlSigner(options.tokenKey && derivedKey(options.tokenKey, 'port-url')),
      portPool: new PortConnectionPool((tenantId, sandboxId, port) => options.engine.connectPort(tenantId, sandboxId, port)),
      ...(options.publicDomain !== undefined && { publicDomain: options.publicDomain.toLowerCase().replace(/^\.+|\.+$/g, '') }),
      ...options.observability,
      ...(options.templates ? { templates: options.templates } : {}),
      ...(options.console?.sessions ? { sessions: options.console.sessions } : {}),
    };
    const feed = options.console?.feed;
    feed?.connect({ listLive: () => records.listLive(), usage: (tenantId, sandboxId) => options.engine.usage(tenantId, sandboxId) });
    this.closeController.signal.addEventListener('abort', () => feed?.close(), { once: true });
    this.closeController.signal.addEventListener('abort', () => this.services.portPool.close(), { once: true });
    this.app = Fastify({
      logger: options.logger ?? false,
      bodyLimit: JSON_BODY_LIMIT_BYTES,
      // Request ids are ours: a client-sent X-Request-Id is not trusted into the logs.
      requestIdHeader: false,
      genReqId: newRequestId,
      return503OnClosing: true,
      // A HEAD of a file or a watch would open the stream only to drop it.
      exposeHeadRoutes: false,
      // A URL Fastify cannot decode never reaches a route: it still gets the one error shape.
      frameworkErrors: (error, request, reply) => {
        sendError(request, reply, error);
      },
      clientErrorHandler: (error, socket) => rejectMalformedRequest(error, socket),
      ...(this.services.publicDomain !== undefined && { rewriteUrl: hostRouting(this.services.publicDomain) }),
    });
    this.routes = [
      ...sandboxRoutes(this.services),
      ...capacityRoutes(this.services),
      ...pauseRoutes(this.services),
      ...snapshotRoutes(this.services),
      ...volumeRoutes(this.services),
      ...networkRoutes(this.services),
      ...processRoutes(this.services),
      ...codeRoutes(this.services),
      ...fileRoutes(this.services),
      ...operatorRoutes(this.services),
      ...artifactRoutes(this.services),
      ...usageRoutes(this.services),
      ...metricsRoutes(this.services),
      ...templateRoutes(this.services),
      ...sessionRoutes(this.services),
      ...liveRoutes(this.services, feed),
      ...adminRoutes(this.services, { feed, dataDir: options.console?.dataDir }),
      ...portUrlRoutes(this.services, now),
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
    this.configure(now);
    registerConsoleUi(this.app, options.console?.uiDir);
    for (const extend of options.extensions ?? []) extend(this.app, this.services);
  }

  private configure(now: () => number): void {
    const { app } = this;
    // Raw bodies (file uploads, stdin) are handed to the route as the request stream, unread.
    app.removeContentTypeParser('text/plain');
    app.addContentTypeParser('application/octet-stream', (_request, payload, done) => done(null, payload as Readable));
    app.addContentTypeParser('*', (_request, payload, done) => done(null, payload as Readable));
    // First: a request waits for its turn before anything else is done for it (fair-turns.ts).
    if (this.fairTurnBudgetMs > 0) {
      const turns = new FairTurns({ budgetMs: this.fairTurnBudgetMs });
      app.addHook('onRequest', (_request, _reply, done) => turns.enter(() => done()));
      app.server.on('connection', () => turns.accepted());
    }
    app.addHook('onRequest', async (request, reply) => {
      reply.header('x-request-id', request.id);
      const done = new Promise<void>((resolve) => reply.raw.once('close', () => resolve()));
      this.inFlight.add(done);
      void done.then(() => this.inFlight.delete(done));
    });
    if (this.services.metrics) recordRequests(app, this.services.metrics);
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
    registerPortRoutes(app, this.services, now);
    registerE2bFacade(app, this.services);
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
  close(options: { forceAfterMs?: number } & EngineCloseOptions = {}): Promise<void> {
    this.closing ??= (async () => {
      const appClosed = this.app.close();
      try {
        await this.services.engine.close({ keepSandboxes: options.keepSandboxes, onLeftRunning: options.onLeftRunning });
      } finally {
        this.closeController.abort();
        // Responses end once their streams have sent their last line; then keep-alive
        // connections, idle or not, are dropped (a client still sending is cut off after the grace).
        let timer: NodeJS.Timeout | undefined;
        const grace = new Promise<void>((resolve) => (timer = setTimeout(resolve, options.forceAfterMs ?? 5000)));
        await Promise.race([Promise.all(this.inFlight), grace]);
        clearTimeout(timer);
        this.app.server.closeAllConnections();
        await appClosed;
      }
    })();
    return this.closing;
  }
}
