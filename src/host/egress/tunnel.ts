import { connect, Socket } from 'node:net';
import type { ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import { parseClientHello, type ClientHelloResult } from './sni.js';

const MAX_HELLO_BYTES = 20_000;

export interface TunnelOptions {
  /** The address the proxy checked; it connects to exactly this one. */
  address: string;
  port: number;
  /** The sandbox's side. */
  socket: Duplex;
  /** Client bytes already read (CONNECT's head, or the ClientHello of a redirected connection). */
  head: Buffer;
  /** Written to the client once the upstream is connected (CONNECT's 200); absent when redirected. */
  greeting?: string;
  connectTimeoutMs: number;
  /** Once connected, a tunnel with no bytes either way for this long is closed. */
  idleTimeoutMs: number;
  /**
   * Sees the client's first bytes, parsed as a TLS ClientHello, before anything goes upstream;
   * returning false closes the tunnel with a reset. Only with `greeting` (inside CONNECT).
   */
  admitHello?: (hello: ClientHelloResult) => boolean;
}

export interface Tunnel {
  upstream: Socket;
  close(): void;
}

/** Connects upstream and splices the two sides; either side closing closes both. */
export function openTunnel(o: TunnelOptions): Tunnel {
  const { socket, greeting } = o;
  const upstream = connect({ host: o.address, port: o.port, timeout: o.connectTimeoutMs });
  let connected = false;
  upstream.once('close', () => {
    if (connected || greeting === undefined) socket.destroy();
  });
  socket.once('close', () => upstream.destroy());
  // Each side's socket times out on its own inactivity; bytes either way are activity on both.
  upstream.on('timeout', () => {
    if (connected) close();
    else upstream.destroy(new Error(`no connection within ${o.connectTimeoutMs} ms`));
  });
  if (socket instanceof Socket) {
    socket.setTimeout(o.idleTimeoutMs);
    socket.on('timeout', () => close());
  }
  const close = (): void => {
    upstream.destroy();
    socket.destroy();
  };
  upstream.once('error', (error) => {
    if (!connected && greeting !== undefined) {
      endRaw(socket, 502, { code: 'EGRESS_UPSTREAM_FAILED', message: `${o.address}:${o.port} failed: ${error.message}` });
    } else {
      reset(socket);
    }
  });
  upstream.once('connect', () => {
    connected = true;
    upstream.setTimeout(o.idleTimeoutMs);
    upstream.pipe(socket); // the server may speak first (SSH, SMTP)
    if (greeting === undefined || !o.admitHello) {
      if (greeting !== undefined) socket.write(greeting);
      if (o.head.length > 0) upstream.write(o.head);
      socket.pipe(upstream);
      socket.resume();
      return;
    }
    socket.write(greeting);
    gateFirstBytes(socket, upstream, o.head, o.admitHello);
  });
  return { upstream, close };
}

/** Holds the client's bytes until they are known not to be TLS, or their ClientHello is admitted. */
function gateFirstBytes(socket: Duplex, upstream: Socket, head: Buffer, admit: (hello: ClientHelloResult) => boolean): void {
  let buffered = head;
  const decide = (): boolean => {
    const hello = parseClientHello(buffered);
    if (hello.kind === 'incomplete' && buffered.length < MAX_HELLO_BYTES) return false;
    socket.off('data', onData);
    if (!admit(hello)) {
      upstream.destroy();
      reset(socket);
      return true;
    }
    upstream.write(buffered);
    socket.pipe(upstream);
    return true;
  };
  const onData = (chunk: Buffer): void => {
    buffered = Buffer.concat([buffered, chunk]);
    if (decide()) socket.off('end', onEnd);
  };
  // The client half-closed before its first bytes were judged: nothing goes upstream, and the
  // upstream is half-closed too (a server that speaks first may still answer), as a pipe would.
  const onEnd = (): void => {
    socket.off('data', onData);
    upstream.end();
  };
  if (buffered.length > 0 && decide()) return;
  socket.on('data', onData);
  socket.once('end', onEnd);
  socket.resume();
}

/** Ends a connection with a TCP reset where possible: a refusal the client sees at once. */
export function reset(socket: Duplex): void {
  if (socket instanceof Socket) socket.resetAndDestroy();
  else socket.destroy();
}

export function sendJson(res: ServerResponse, status: number, body: object): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text), connection: 'close' });
  res.end(text);
}

/** An HTTP answer written on a raw socket (a CONNECT refusal). */
export function endRaw(socket: Duplex, status: number, body: object): void {
  const text = JSON.stringify(body);
  const reason = status === 403 ? 'Forbidden' : status === 429 ? 'Too Many Requests' : status === 400 ? 'Bad Request' : status === 503 ? 'Service Unavailable' : 'Bad Gateway';
  socket.end(`HTTP/1.1 ${status} ${reason}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(text)}\r\nconnection: close\r\n\r\n${text}`);
}
