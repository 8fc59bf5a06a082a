import { request as httpRequest, type Agent, type IncomingHttpHeaders, type IncomingMessage, type OutgoingHttpHeaders } from 'node:http';
import type { Duplex } from 'node:stream';
import type { FastifyReply, FastifyRequest } from 'fastify';
import { SandboxError } from '../../errors/index.js';
import { PORT_TOKEN_COOKIE, takeCookie } from './port-access.js';
import { ACCESS_TOKEN_HEADERS, type PortCredential } from './port-auth.js';

/** Headers of one hop (RFC 9110 §7.6.1): never forwarded, either way. */
const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'proxy-authorization', 'proxy-authenticate', 'te', 'trailer', 'transfer-encoding', 'upgrade']);

/** What an upgrade request (WebSocket) brought besides its headers: the client's socket and early bytes. */
export interface UpgradeSocket {
  socket: Duplex;
  head: Buffer;
}

const UPGRADE = Symbol('capsule.upgrade');

/** Marks a request that came in through the server's 'upgrade' event. */
export function markUpgrade(request: IncomingMessage, upgrade: UpgradeSocket): void {
  (request as IncomingMessage & { [UPGRADE]?: UpgradeSocket })[UPGRADE] = upgrade;
}

export function upgradeOf(request: IncomingMessage): UpgradeSocket | undefined {
  return (request as IncomingMessage & { [UPGRADE]?: UpgradeSocket })[UPGRADE];
}

export interface ForwardOptions {
  /** Path and query as the server in the sandbox sees them (no signed-URL token). */
  path: string;
  port: number;
  credential: PortCredential;
  /** The path prefix the app is served under (path form), for X-Forwarded-Prefix. */
  prefix?: string;
}

/**
 * The client's headers as the sandbox's server gets them: no hop-by-hop headers (but a WebSocket
 * upgrade's own), and none of the credentials that reached Capsule: the tenant's key when it was
 * used, access tokens, the signed URL's cookie.
 */
export function forwardHeaders(headers: IncomingHttpHeaders, options: ForwardOptions & { remoteAddress?: string; isUpgrade: boolean }): OutgoingHttpHeaders {
  const out: OutgoingHttpHeaders = {};
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined || HOP_BY_HOP.has(name)) continue;
    if ((ACCESS_TOKEN_HEADERS as readonly string[]).includes(name)) continue;
    if (options.credential === 'api-key' && (name === 'authorization' || name === 'x-api-key')) continue;
    out[name] = value;
  }
  const cookie = takeCookie(headers.cookie, PORT_TOKEN_COOKIE).rest;
  if (cookie === undefined) delete out.cookie;
  else out.cookie = cookie;
  if (options.isUpgrade && typeof headers.upgrade === 'string') {
    out.connection = 'Upgrade';
    out.upgrade = headers.upgrade;
  }
  if (options.remoteAddress !== undefined) {
    const before = typeof headers['x-forwarded-for'] === 'string' ? `${headers['x-forwarded-for']}, ` : '';
    out['x-forwarded-for'] = `${before}${options.remoteAddress}`;
  }
  if (typeof headers.host === 'string') out['x-forwarded-host'] = headers.host;
  out['x-forwarded-proto'] = 'http';
  if (options.prefix !== undefined) out['x-forwarded-prefix'] = options.prefix;
  return out;
}

/** The sandbox's answer headers as the client gets them (no hop-by-hop), plus `extraCookie`. */
export function answerHeaders(headers: IncomingHttpHeaders, extraCookie?: string): OutgoingHttpHeaders {
  const out: OutgoingHttpHeaders = {};
  for (const [name, value] of Object.entries(headers)) {
    if (value !== undefined && !HOP_BY_HOP.has(name)) out[name] = value;
  }
  if (extraCookie !== undefined) out['set-cookie'] = [...(headers['set-cookie'] ?? []), extraCookie];
  return out;
}

export type UpstreamAnswer =
  | { kind: 'response'; response: IncomingMessage }
  | { kind: 'upgrade'; response: IncomingMessage; socket: Duplex; head: Buffer };

/** How a request reaches the sandbox's port: its own relay, or a keep-alive agent's pooled ones. */
export type Upstream = { relay: Duplex } | { agent: Agent };

/** Methods that change nothing: one whose pooled connection was found closed is sent again, once. */
const SAFE_METHODS = new Set(['GET', 'HEAD', 'OPTIONS']);

/**
 * Sends the request upstream and resolves with the sandbox server's answer headers (or its 101
 * for an upgrade). The request body streams meanwhile. A connection the server ends before
 * answering is PORT_NOT_LISTENING (502), answered by the seam in Capsule's error shape; so is a
 * port nobody listens on (the relay's own error, with its hint).
 */
export async function sendUpstream(request: FastifyRequest, upstream: Upstream, options: ForwardOptions, signal: AbortSignal): Promise<UpstreamAnswer> {
  const bodiless = SAFE_METHODS.has(request.raw.method ?? '') && request.headers['content-length'] === undefined && request.headers['transfer-encoding'] === undefined;
  try {
    return await exchange(request, upstream, options, signal, bodiless);
  } catch (error) {
    // A pooled connection the server closed while it sat idle fails at once on reuse, before any
    // answer: a request with no body is sent again on a new connection, as browsers do.
    if (!(error instanceof StaleConnection) || !bodiless) throw unwrap(error);
    return await exchange(request, upstream, options, signal, bodiless).catch((again: unknown) => {
      throw unwrap(again);
    });
  }
}

/** A failure on a reused pooled connection before the answer began (the request may be resent). */
class StaleConnection extends Error {
  constructor(readonly failure: SandboxError) {
    super(failure.message);
  }
}

function unwrap(error: unknown): unknown {
  return error instanceof StaleConnection ? error.failure : error;
}

function exchange(request: FastifyRequest, upstream: Upstream, options: ForwardOptions, signal: AbortSignal, bodiless: boolean): Promise<UpstreamAnswer> {
  const upgrade = upgradeOf(request.raw);
  const outgoing = httpRequest({
    method: request.raw.method,
    path: options.path,
    headers: forwardHeaders(request.headers, { ...options, remoteAddress: request.ip, isUpgrade: upgrade !== undefined }),
    ...('relay' in upstream ? { createConnection: () => upstream.relay } : { agent: upstream.agent }),
    signal,
  });
  return new Promise<UpstreamAnswer>((resolve, reject) => {
    outgoing.once('response', (response) => resolve({ kind: 'response', response }));
    outgoing.once('upgrade', (response, socket, head) => resolve({ kind: 'upgrade', response, socket, head }));
    outgoing.once('error', (error: Error & { code?: string }) => {
      if ('relay' in upstream) upstream.relay.destroy();
      // The relay's own refusal (nothing listens, too many relays, sandbox not running) as it is.
      if (error instanceof SandboxError) {
        reject(error);
        return;
      }
      const failure = new SandboxError('PORT_NOT_LISTENING', `the server on port ${options.port} in the sandbox ended the connection without an answer (${error.code ?? error.message})`, {
        details: { port: options.port },
        hint: 'Check the server in the sandbox (its log, or whether it still runs), then retry.',
        cause: error,
      });
      reject(outgoing.reusedSocket ? new StaleConnection(failure) : failure);
    });
    // No body to stream (and none to read twice when the request is sent again).
    if (upgrade !== undefined || bodiless) {
      outgoing.end();
      return;
    }
    const body = request.raw;
    body.pipe(outgoing);
    body.once('error', () => outgoing.destroy());
  });
}

/** Writes the sandbox server's answer to the client; resolves when the exchange ended. */
export function writeAnswer(request: FastifyRequest, reply: FastifyReply, answer: UpstreamAnswer, extraCookie?: string): Promise<void> {
  reply.hijack();
  if (answer.kind === 'response') {
    return new Promise<void>((resolve) => {
      const raw = reply.raw;
      raw.writeHead(answer.response.statusCode ?? 502, answer.response.statusMessage, answerHeaders(answer.response.headers, extraCookie));
      answer.response.pipe(raw);
      // A client that goes away ends the relay too: the agent closes its socket in the sandbox.
      raw.once('close', () => {
        if (!answer.response.complete) answer.response.destroy();
        resolve();
      });
      answer.response.once('error', () => raw.destroy());
    });
  }
  const client = upgradeOf(request.raw);
  if (client === undefined) throw new SandboxError('INTERNAL', 'the sandbox switched protocols on a request that did not ask to');
  return new Promise<void>((resolve) => {
    const { response, socket: upstream, head } = answer;
    const lines = [`HTTP/1.1 ${response.statusCode ?? 101} ${response.statusMessage ?? 'Switching Protocols'}`];
    for (let i = 0; i + 1 < response.rawHeaders.length; i += 2) lines.push(`${response.rawHeaders[i]}: ${response.rawHeaders[i + 1]}`);
    client.socket.write(`${lines.join('\r\n')}\r\n\r\n`);
    if (head.length > 0) client.socket.write(head);
    if (client.head.length > 0) upstream.write(client.head);
    upstream.pipe(client.socket);
    client.socket.pipe(upstream);
    const end = () => {
      upstream.destroy();
      client.socket.destroy();
      resolve();
    };
    upstream.once('close', end);
    client.socket.once('close', end);
    upstream.once('error', end);
    client.socket.once('error', end);
  });
}
