import { ServerResponse, type IncomingMessage } from 'node:http';
import type { Socket } from 'node:net';
import type { Duplex, Readable } from 'node:stream';
import type { FastifyInstance } from 'fastify';
import { z } from 'zod';
import { ErrorBodySchema, SANDBOX_ID_PATTERN } from '../../wire/index.js';
import { defineRoute, registerRoute, type AnyRoute, httpOnly, type RouteDefinition } from '../route.js';
import { requireSandbox, type ServerServices } from '../services.js';
import { DEFAULT_PORT_URL_TTL_MS, MAX_PORT_URL_TTL_MS, PORT_TOKEN_COOKIE, PORT_TOKEN_PARAM, parsePortHost, portPath, withoutToken } from './port-access.js';
import { portPrincipal, type PortPrincipal } from './port-auth.js';
import { markUpgrade, sendUpstream, upgradeOf, writeAnswer } from './port-proxy.js';

const PORT = z.coerce.number().int().min(1).max(65_535);
const PortParams = z.object({ sandboxId: z.string().regex(SANDBOX_ID_PATTERN), port: PORT, '*': z.string().optional() });
const PROXIED_METHODS = ['GET', 'POST', 'PUT', 'DELETE', 'PATCH', 'HEAD', 'OPTIONS'] as const;

const PortUrlBody = z.strictObject({
  port: PORT.meta({ description: 'The port inside the sandbox' }),
  expiresInMs: z.number().int().positive().max(MAX_PORT_URL_TTL_MS).optional().meta({ description: 'How long the URL works. @default 3600000 (1 hour)' }),
});
const PortUrlAnswer = z.object({
  url: z.string().meta({ description: 'Path form: works against this server as it is (curl, a browser)' }),
  hostUrl: z.string().optional().meta({ description: 'Host form `http://P-ID.DOMAIN/…`, when the server has a public domain' }),
  token: z.string().meta({ description: `The signed token (query parameter ${PORT_TOKEN_PARAM})` }),
  expiresAt: z.string().meta({ description: 'When the URL stops working (ISO 8601)' }),
});

/** The base URL a client reached this server at, from its request. */
/**
 * `POST /v1/sandboxes/{id}/port-urls`: a signed URL to one port of the tenant's sandbox, for
 * a browser or curl that cannot send headers. It is audited: it hands out access.
 */
export function portUrlRoutes(services: ServerServices, now: () => number): AnyRoute[] {
  return [
    defineRoute({
      name: 'sandboxes.portUrl',
      method: 'POST',
      url: '/v1/sandboxes/:sandboxId/port-urls',
      summary: 'A signed URL reaching a port of the sandbox through this server (HTTP and WebSocket)',
      auth: 'tenant',
      params: z.strictObject({ sandboxId: z.string().regex(SANDBOX_ID_PATTERN) }),
      body: PortUrlBody,
      responses: {
        200: { description: 'The URL, its token and expiry', schema: PortUrlAnswer },
        404: { description: 'No such sandbox', schema: ErrorBodySchema },
      },
      audit: ({ params, body }) => ({ sandboxId: params.sandboxId, port: body.port, expiresInMs: body.expiresInMs ?? DEFAULT_PORT_URL_TTL_MS }),
      handler({ params, body, principal, origin }) {
        requireSandbox(services, principal.tenantId, params.sandboxId);
        const expiresAtMs = now() + (body.expiresInMs ?? DEFAULT_PORT_URL_TTL_MS);
        const token = services.portUrls.sign({ tenantId: principal.tenantId, sandboxId: params.sandboxId, port: body.port }, expiresAtMs);
        const query = `?${PORT_TOKEN_PARAM}=${encodeURIComponent(token)}`;
        const answer = {
          sandboxId: params.sandboxId,
          url: `${origin}${portPath(params.sandboxId, body.port)}${query}`,
          ...(services.publicDomain !== undefined && { hostUrl: `${origin.slice(0, origin.indexOf(':'))}://${body.port}-${params.sandboxId}.${services.publicDomain}/${query}` }),
          token,
          expiresAt: new Date(Math.floor(expiresAtMs / 1000) * 1000).toISOString(),
        };
        return { kind: 'json', status: 200, body: answer };
      },
    }),
  ];
}

/** The proxy: every method of `/v1/sandboxes/{id}/ports/{port}/*`, relayed to the sandbox's port. */
function proxyRoutes(services: ServerServices, now: () => number): AnyRoute[] {
  return PROXIED_METHODS.map((method) =>
    defineRoute({
      name: 'sandboxes.ports.proxy',
      wakes: true,
      method,
      url: '/v1/sandboxes/:sandboxId/ports/:port/*',
      summary: 'Relay a request to a port inside the sandbox',
      auth: (request) => portPrincipal(services, request, now()),
      passThrough: true,
      params: PortParams,
      async handler({ params, principal, request: maybeHttp, signal }: Parameters<RouteDefinition<z.output<typeof PortParams>>['handler']>[0]) {
        const request = httpOnly(maybeHttp);
        const port = principal as PortPrincipal;
        requireSandbox(services, port.tenantId, params.sandboxId);
        const prefix = portPath(params.sandboxId, params.port, '');
        const isHostForm = services.publicDomain !== undefined && parsePortHost(request.headers.host, services.publicDomain) !== undefined;
        const path = withoutToken(request.url.startsWith(prefix) ? request.url.slice(prefix.length) || '/' : '/');
        // A WebSocket gets a relay of its own (it leaves any pool once upgraded); plain HTTP reuses
        // the port's keep-alive relays.
        const connection = upgradeOf(request.raw)
          ? { relay: await services.engine.connectPort(port.tenantId, params.sandboxId, params.port, { signal }) }
          : { agent: services.portPool.agentFor(port.tenantId, params.sandboxId, params.port) };
        const answer = await sendUpstream(request, connection, { path, port: params.port, credential: port.credential, ...(!isHostForm && { prefix }) }, signal);
        // A signed URL opened in a browser keeps working for the page's own links and requests.
        const cookie =
          port.queryToken === undefined
            ? undefined
            : `${PORT_TOKEN_COOKIE}=${port.queryToken}; Path=${isHostForm ? '/' : `${prefix}/`}; HttpOnly; SameSite=Lax`;
        return { kind: 'stream', write: (reply) => writeAnswer(request, reply, answer, cookie) };
      },
    }),
  );
}

/**
 * Registers the port proxy in a scope of its own, where no body is parsed (it goes to the
 * sandbox unread), and routes WebSocket upgrades through the same routes: the upgrade's socket
 * gets a response object, so authentication, errors and the seam apply to it as to any request.
 */
export function registerPortRoutes(app: FastifyInstance, services: ServerServices, now: () => number): void {
  void app.register((scope, _options, done) => {
    scope.removeAllContentTypeParsers();
    scope.addContentTypeParser('*', (_request, payload, parsed) => parsed(null, payload as Readable));
    for (const route of proxyRoutes(services, now)) registerRoute(scope, services, route);
    done();
  });
  app.server.on('upgrade', (request: IncomingMessage, socket: Duplex, head: Buffer) => routeUpgrade(app, request, socket, head));
}

function routeUpgrade(app: FastifyInstance, request: IncomingMessage, socket: Duplex, head: Buffer): void {
  const response = new ServerResponse(request);
  response.shouldKeepAlive = false;
  response.assignSocket(socket as Socket);
  // An answer that is not a protocol switch (an error, a plain response) ends the connection.
  response.once('finish', () => socket.end());
  socket.once('error', () => socket.destroy());
  markUpgrade(request, { socket, head });
  app.routing(request, response);
}

/** Fastify's `rewriteUrl`: a request to `P-ID.DOMAIN` is served by the port proxy's path form. */
export function hostRouting(publicDomain: string | undefined): ((request: IncomingMessage) => string) | undefined {
  if (publicDomain === undefined) return undefined;
  return (request) => {
    const url = request.url ?? '/';
    const target = parsePortHost(request.headers.host, publicDomain);
    return target ? portPath(target.sandboxId, target.port, url) : url;
  };
}
