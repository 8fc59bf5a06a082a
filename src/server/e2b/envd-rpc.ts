import type { FastifyRequest } from 'fastify';
import { z } from 'zod';
import { defineRoute, type AnyRoute, type Authenticate, httpOnly, type RouteResult } from '../route.js';
import { sandboxOf, type SandboxAccess } from './access.js';
import { ConnectError } from './connect-protocol.js';
import type { PortConstraint } from './deps.js';

/** A Connect message: a JSON object (a unary body, or a stream's decoded request envelope). */
export const ConnectMessage = z.record(z.string(), z.unknown());
export type Message = z.infer<typeof ConnectMessage>;

export type RpcHandler = (access: SandboxAccess, message: Message, request: FastifyRequest) => RouteResult | Promise<RouteResult>;

/**
 * The routes of one envd Connect service (`process.Process`, `filesystem.Filesystem`): each
 * method a POST through the seam, for the sandbox of the caller's access token. With `subject`
 * a method is mutating and audited, the subject (argv, path) hashed into the record.
 */
export function envdService(service: string, auth: Authenticate, constraints: PortConstraint) {
  return (name: string, method: string, handler: RpcHandler, subject?: (message: Message) => string): AnyRoute =>
    defineRoute({
      name: `e2b.${name}`,
      method: 'POST',
      url: `/${service}/${method}`,
      summary: `envd: ${service}/${method}`,
      auth,
      constraints,
      body: ConnectMessage,
      ...(subject ? { audit: ({ body, principal }: { body: Message; principal: { sandboxId?: string } }) => ({ sandboxId: principal.sandboxId, subject: subject(body) }) } : {}),
      handler: ({ principal, body, request }) => handler(sandboxOf(principal), body, httpOnly(request)),
    });
}

/** A unary answer. */
export function reply(body: object): RouteResult {
  return { kind: 'json', status: 200, body };
}

export function record(value: unknown, field: string): Record<string, unknown> {
  if (value && typeof value === 'object' && !Array.isArray(value)) return value as Record<string, unknown>;
  throw new ConnectError('invalid_argument', `${field} is required`);
}
