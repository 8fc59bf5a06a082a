import { request as httpRequest, type IncomingMessage, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { sendJson } from './tunnel.js';

const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'proxy-authorization', 'proxy-authenticate', 'te', 'trailer', 'upgrade']);

export interface ForwardHttpOptions {
  req: IncomingMessage;
  res: ServerResponse;
  /** The name and port the sandbox asked for (for messages), and `Host` as it goes upstream. */
  host: string;
  port: number;
  hostHeader: string;
  /** Path and query, as parsed. */
  path: string;
  /** The address the proxy checked; it connects to exactly this one. */
  address: string;
  connectTimeoutMs: number;
  idleTimeoutMs: number;
  /** Called once when the upstream request closes (its connection slot is given back). */
  release: () => void;
  /** Called with a way to close the request (a policy change); and when it is done. */
  track: (close: () => void) => () => void;
}

/**
 * Forwards one plain HTTP request upstream and its answer back, hop-by-hop headers dropped.
 * Connecting has its own bound; once connected, the idle timeout applies (an upstream may think
 * for minutes before it answers, not for ever). While the request is upstream that timer guards
 * it (bytes either way are activity there), so a silent upstream ends in a 502 rather than a
 * bare close by the sandbox side's own timer.
 */
export function forwardHttp(o: ForwardHttpOptions): void {
  const { req, res } = o;
  const headers: Record<string, string | string[]> = {};
  for (const [name, value] of Object.entries(req.headers)) if (value !== undefined && !HOP_BY_HOP.has(name)) headers[name] = value;
  headers.host = o.hostHeader;
  const upstream = httpRequest({ host: o.address, port: o.port, method: req.method, path: o.path, headers, setHost: false, agent: false, timeout: o.connectTimeoutMs });
  upstream.once('close', o.release);
  const untrack = o.track(() => {
    upstream.destroy();
    res.destroy();
  });
  // When the answer is done or the sandbox's connection goes (a pipelined request whose answer
  // is queued behind another never sees its own close), the upstream goes too.
  const gone = (): void => void upstream.destroy();
  req.socket.once('close', gone);
  upstream.once('close', () => req.socket.off('close', gone));
  res.once('close', () => {
    untrack();
    upstream.destroy();
  });
  req.socket.setTimeout(0);
  let connected = false;
  upstream.once('socket', (socket: Socket) => {
    const onConnect = (): void => {
      connected = true;
      upstream.setTimeout(o.idleTimeoutMs);
    };
    if (socket.connecting) socket.once('connect', onConnect);
    else onConnect();
  });
  upstream.on('timeout', () => {
    upstream.destroy(new Error(connected ? `no bytes for ${o.idleTimeoutMs} ms (the proxy's idle timeout)` : `no connection within ${o.connectTimeoutMs} ms`));
  });
  upstream.once('response', (response) => {
    const out: Record<string, string | string[]> = {};
    for (const [name, value] of Object.entries(response.headers)) if (value !== undefined && !HOP_BY_HOP.has(name)) out[name] = value;
    res.writeHead(response.statusCode ?? 502, out);
    response.pipe(res);
  });
  upstream.once('error', (error) => {
    if (res.headersSent) res.destroy();
    else sendJson(res, 502, { code: 'EGRESS_UPSTREAM_FAILED', message: `${o.host}:${o.port} failed: ${error.message}` });
  });
  req.pipe(upstream);
}
