import type { FastifyInstance } from 'fastify';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { AjvJsonSchemaValidator } from '@modelcontextprotocol/sdk/validation/ajv';
import { z } from 'zod';
import { presentedKey } from '../server/auth.js';
import { defineRoute, registerRoute } from '../server/route.js';
import type { ServerServices } from '../server/services.js';
import { createMcpServer } from './server.js';
import { SandboxHandles } from '../agent-tools/index.js';

/** Where this server answers on loopback: the MCP tools call the API there, with the caller's key. */
function loopbackUrl(app: FastifyInstance): string {
  const address = app.server.address();
  if (address === null || typeof address === 'string') throw new Error('the server is not listening on TCP');
  const host = address.address === '0.0.0.0' ? '127.0.0.1' : address.address === '::' ? '::1' : address.address;
  return `http://${host.includes(':') ? `[${host}]` : host}:${address.port}`;
}

/**
 * MCP over streamable HTTP at `/mcp` (stateless: each POST carries a whole exchange), a route of
 * the one seam: authenticated with the tenant's API key like `/v1`. Its tools call `/v1` with
 * that same key, so each tool call is tenant-scoped, and audited when it changes something, by
 * the routes that do the work. A server extension (`capsule serve` adds it).
 */
export function registerMcpHttp(app: FastifyInstance, services: ServerServices): void {
  // Stateless HTTP makes a server per request; the sandbox handles and the validator outlive them.
  const handles = new SandboxHandles();
  const validator = new AjvJsonSchemaValidator();
  for (const method of ['POST', 'GET', 'DELETE'] as const) {
    registerRoute(
      app,
      services,
      defineRoute({
        name: 'mcp',
        method,
        url: '/mcp',
        summary: 'Model Context Protocol (streamable HTTP, stateless)',
        auth: 'tenant',
        ...(method === 'POST' && { body: z.unknown() }),
        handler({ request, body }) {
          const connection = { url: loopbackUrl(app), apiKey: presentedKey(request) ?? '' };
          return {
            kind: 'stream',
            async write(reply) {
              reply.hijack();
              const server = createMcpServer(connection, handles, validator);
              const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: true });
              await server.connect(transport);
              try {
                await transport.handleRequest(request.raw, reply.raw, body);
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
