import type { ServerResponse } from 'node:http';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { WebStandardStreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/webStandardStreamableHttp.js';
import { AjvJsonSchemaValidator } from '@modelcontextprotocol/sdk/validation/ajv';
import { z } from 'zod';
import { presentedKey } from '../server/auth.js';
import { defineRoute, registerRoute } from '../server/route.js';
import type { ServerServices } from '../server/services.js';
import { createMcpServer } from './server.js';
import { SandboxHandles } from '../agent-tools/index.js';

/** The headers the SDK's web-standard transport reads (content negotiation, protocol version, session). */
const MCP_HEADERS = ['accept', 'content-type', 'mcp-protocol-version', 'mcp-session-id', 'last-event-id'] as const;

/** The request as the SDK's web-standard transport reads it: method, URL and its headers (the body is passed parsed). */
function webRequest(request: FastifyRequest): Request {
  const headers = new Headers();
  for (const name of MCP_HEADERS) {
    const value = request.headers[name];
    if (typeof value === 'string') headers.set(name, value);
  }
  return new Request(new URL(request.url, 'http://mcp.invalid'), { method: request.method, headers });
}

/** Writes the transport's answer (a JSON body, or none for 202) on the hijacked reply. */
async function writeResponse(out: ServerResponse, response: Response): Promise<void> {
  const headers: Record<string, string> = {};
  response.headers.forEach((value, name) => (headers[name] = value));
  const body = response.body ? Buffer.from(await response.arrayBuffer()) : undefined;
  headers['content-length'] = String(body?.length ?? 0);
  out.writeHead(response.status, headers);
  out.end(body);
}

/**
 * What a stateless server answers a GET (a stream for server-initiated messages) and a DELETE
 * (the end of a session): 405, as the transport specification allows. Each POST gets a server of
 * its own that is gone when it is answered, so a standalone stream would never carry anything and
 * there is no session to end; a client then goes on with POSTs alone.
 */
function notAllowed(out: ServerResponse, method: string): void {
  const body = JSON.stringify({
    jsonrpc: '2.0',
    error: { code: -32000, message: `Method Not Allowed: this MCP endpoint is stateless; ${method} has nothing to open or end, send JSON-RPC messages with POST` },
    id: null,
  });
  out.writeHead(405, { allow: 'POST', 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(body)) });
  out.end(body);
}

/**
 * MCP over streamable HTTP at `/mcp` (stateless: each POST carries a whole exchange, answered as
 * JSON), a route of the one seam: authenticated with the tenant's API key like `/v1`. Its tools
 * call `/v1` with that same key, so each tool call is tenant-scoped, and audited when it changes
 * something, by the routes that do the work. A server extension (`capsule serve` adds it).
 *
 * The SDK's web-standard transport does the protocol (headers, JSON-RPC validation, batches,
 * 202 for notifications); it gets the request's headers and its body already parsed, and its
 * answer is written back directly: the SDK's Node wrapper converts the whole request and reply
 * through @hono/node-server, a third of this route's own time per tool call.
 */
export function registerMcpHttp(app: FastifyInstance, services: ServerServices): void {
  // Stateless HTTP makes a server per request; the sandbox handles and the validator outlive them.
  const handles = new SandboxHandles();
  const validator = new AjvJsonSchemaValidator();
  // The tools' calls reach the /v1 routes in-process, through the seam (decision 024).
  const transport = services.calls.transport(app.log);
  for (const method of ['POST', 'GET', 'DELETE'] as const) {
    registerRoute(
      app,
      services,
      defineRoute({
        name: 'mcp',
        method,
        url: '/mcp',
        summary: 'Model Context Protocol (streamable HTTP, stateless; GET and DELETE answer 405)',
        auth: 'tenant',
        ...(method === 'POST' && { body: z.unknown() }),
        handler({ headers, body, origin }) {
          // The origin the MCP client reached: what URLs handed back to it (port_url) are built on.
          const connection = { url: origin, apiKey: presentedKey({ headers }) ?? '', transport };
          return {
            kind: 'stream',
            async write(reply) {
              reply.hijack();
              if (method !== 'POST') return notAllowed(reply.raw, method);
              const server = createMcpServer(connection, handles, validator);
              const transport = new WebStandardStreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: true });
              await server.connect(transport);
              try {
                await writeResponse(reply.raw, await transport.handleRequest(webRequest(reply.request), { parsedBody: body }));
              } finally {
                await server.close();
              }
            },
          };
        },
      }),
    );
  }
}
