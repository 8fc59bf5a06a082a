import http, { type ClientRequest, type IncomingMessage } from 'node:http';
import https from 'node:https';
import { type CapsuleError, ConnectionError } from './errors.js';
import { aborted, Call, collect, ignore, OpenReply, readError, toCapsuleError, type OpenResponse } from './reply.js';
import type { ResolvedConfig } from './config.js';
import type { RequestBody, Transport, TransportReply, TransportRequest } from '../wire/transport.js';
import type { CallOptions } from './types.js';

export type { OpenResponse } from './reply.js';
export type { RequestBody, Transport, TransportReply, TransportRequest } from '../wire/transport.js';

export type Method = 'GET' | 'POST' | 'PUT' | 'DELETE';
export type QueryValue = string | number | boolean | readonly string[] | undefined;

export interface RequestOptions {
  method: Method;
  path: string;
  query?: Record<string, QueryValue>;
  /** Sent as JSON. */
  json?: unknown;
  /** Sent as `application/octet-stream`. A stream (any async iterable) is sent once: it cannot be replayed. */
  body?: RequestBody;
  /** Deadline: of the whole call, or of the reply's headers for `open()`; 0 for none. @default config.timeoutMs */
  timeoutMs?: number;
  signal?: AbortSignal;
}

/** Only the per-call options of a wider options object (whose `timeoutMs` may mean something else). */
export function callOptions(options: CallOptions): CallOptions {
  return { timeoutMs: options.timeoutMs, signal: options.signal };
}

const RETRY_STATUSES = new Set([502, 503]);
const USER_AGENT = 'capsule-sdk/0.1.0';
const ACCEPT = 'application/json, application/x-ndjson';
/**
 * Idle sockets kept per server. Open sockets are not capped: a stream (a foreground run, a
 * watch) holds its socket for as long as it lasts, and a cap would queue the next call (even the
 * kill that would end one) behind them until its deadline.
 */
const MAX_FREE_SOCKETS = 64;
/**
 * An idle kept-alive socket is closed after this long (sooner when the server's `Keep-Alive`
 * header asks). Idle sockets are unref'd by Node, so they never keep a script's process alive.
 */
const IDLE_SOCKET_MS = 30_000;
/**
 * One keep-alive agent per server origin, shared by every client of the process: `Sandbox.list`,
 * `Sandbox.create` and each sandbox's calls reuse the same connections, however many Sandbox
 * objects exist. This is the SDK's one piece of module state: a cache of connection pools, like
 * Node's own `http.globalAgent`.
 */
const AGENTS = new Map<string, http.Agent>();

function agentFor(url: URL): http.Agent {
  const existing = AGENTS.get(url.origin);
  if (existing) return existing;
  const options: http.AgentOptions = { keepAlive: true, maxFreeSockets: MAX_FREE_SOCKETS, timeout: IDLE_SOCKET_MS, noDelay: true };
  const agent = url.protocol === 'https:' ? new https.Agent(options) : new http.Agent(options);
  AGENTS.set(url.origin, agent);
  return agent;
}

/** Where requests go, parsed once from `config.url`. */
interface Target {
  request: typeof http.request;
  agent: http.Agent;
  hostname: string;
  port: string;
  /** The URL's path (`/capsule` of `http://host/capsule`), put before every request's path. */
  prefix: string;
}

/**
 * The one place the SDK talks HTTP (node:http over a keep-alive agent: less work per call than
 * WHATWG fetch, and no web streams on the hot paths). Mutating calls carry a fresh
 * `Idempotency-Key`, and every call is retried once, with the same key, when the connection
 * failed or the server answered 502/503 (but not CAPACITY_EXHAUSTED): the server's idempotency
 * makes the retry safe.
 */
export class HttpClient {
  private parsed: Target | undefined;

  constructor(readonly config: ResolvedConfig) {}

  /** Sends a request and returns its JSON reply (undefined for an empty one, e.g. 204). */
  async json<T>(options: RequestOptions): Promise<T> {
    const bytes = await this.whole(options);
    return (bytes.length === 0 ? undefined : JSON.parse(bytes.toString('utf8'))) as T;
  }

  /** Sends a request and returns the reply's bytes. */
  async bytes(options: RequestOptions): Promise<Uint8Array> {
    const bytes = await this.whole(options);
    // A copy of its own: the reply's Buffer may be a view into a larger shared one.
    const copy = new Uint8Array(bytes.length);
    copy.set(bytes);
    return copy;
  }

  /**
   * Sends a request and hands back the reply once its headers arrived; the deadline ends there
   * (the body may stream for as long as it needs).
   */
  async open(options: RequestOptions): Promise<OpenResponse> {
    const { res, call } = await this.exchange(options, false);
    return new OpenReply(res, call, this.config.url);
  }

  /** The whole reply body; the deadline covers the call up to its last byte. */
  private async whole(options: RequestOptions): Promise<Buffer> {
    const { res, call } = await this.exchange(options, true);
    try {
      return await collect(res, call);
    } catch (error) {
      throw toCapsuleError(error, 'reading the reply', this.config.url, call);
    } finally {
      call.release();
    }
  }

  /**
   * Sends the request (twice at most) and returns a 2xx reply with its headers read; any other
   * reply becomes its typed error. `wholeCall` keeps the deadline running after the headers.
   */
  private async exchange(options: RequestOptions, wholeCall: boolean): Promise<{ res: TransportReply; call: Call }> {
    const what = `${options.method} ${options.path}`;
    if (options.signal?.aborted) throw aborted(what, options.signal.reason);
    const { transport } = this.config;
    const target = transport ? undefined : (this.parsed ??= this.target());
    const headers: http.OutgoingHttpHeaders = { 'user-agent': USER_AGENT, accept: ACCEPT };
    if (this.config.apiKey !== undefined) headers.authorization = `Bearer ${this.config.apiKey}`;
    // Over HTTP a call may be sent twice (below), so the server must know it is the same one. A
    // transport's calls have no connection to lose and no proxy between: sent once, with no key.
    const retries = transport === undefined;
    if (options.method !== 'GET' && retries) headers['idempotency-key'] = crypto.randomUUID();
    let body: RequestBody | undefined;
    if (options.json !== undefined) {
      headers['content-type'] = 'application/json';
      body = JSON.stringify(options.json);
    } else if (options.body !== undefined) {
      headers['content-type'] = 'application/octet-stream';
      body = options.body;
    }
    const replayable = body === undefined || typeof body === 'string' || body instanceof Uint8Array;
    // A known length spares the server chunked decoding; a stream goes chunked.
    if (typeof body === 'string') headers['content-length'] = Buffer.byteLength(body);
    else if (body instanceof Uint8Array) headers['content-length'] = body.byteLength;
    const path = (target?.prefix ?? '') + withQuery(options.path, options.query);
    const timeoutMs = options.timeoutMs ?? this.config.timeoutMs;
    for (let attempt = 1; ; attempt++) {
      const call = new Call(options.signal, timeoutMs);
      let res: TransportReply;
      try {
        res = target ? await send(target, options.method, path, headers, body, call) : await sendBy(transport!, { method: options.method, origin: this.origin(), path, headers, body }, call);
      } catch (error) {
        call.release();
        const typed = toCapsuleError(error, what, this.config.url, call);
        if (attempt === 1 && retries && replayable && typed instanceof ConnectionError) continue;
        throw typed;
      }
      const status = res.statusCode ?? 0;
      if (status >= 200 && status < 300) {
        if (!wholeCall) call.stopDeadline();
        return { res, call };
      }
      let error: CapsuleError;
      try {
        error = await readError(res, call);
      } catch (failure) {
        error = toCapsuleError(failure, what, this.config.url, call);
      } finally {
        call.release();
      }
      // CAPACITY_EXHAUSTED is the server's answer about the moment, not a proxy's hiccup: the
      // caller decides (Retry-After in `details.retryAfterS`, or waitForCapacityMs).
      const retryable = (RETRY_STATUSES.has(status) && error.code !== 'CAPACITY_EXHAUSTED') || error instanceof ConnectionError;
      if (attempt === 1 && retries && replayable && retryable) continue;
      throw error;
    }
  }

  private originOf: string | undefined;

  /** The server's origin as configured (what an in-process call says it reached). */
  private origin(): string {
    return (this.originOf ??= new URL(this.config.url).origin);
  }

  private target(): Target {
    const url = new URL(this.config.url);
    if (url.protocol !== 'http:' && url.protocol !== 'https:') {
      throw new ConnectionError('SERVER_UNREACHABLE', `cannot reach the Capsule server at ${this.config.url} (unsupported protocol ${url.protocol})`, {
        hint: 'Use an http:// or https:// URL in CAPSULE_URL (or the url option).',
        details: { url: this.config.url },
      });
    }
    return {
      request: url.protocol === 'https:' ? https.request : http.request,
      agent: agentFor(url),
      // An IPv6 literal is [::1] in a URL and ::1 for the socket.
      hostname: url.hostname.replace(/^\[(.*)\]$/, '$1'),
      port: url.port,
      prefix: url.pathname.replace(/\/+$/, ''),
    };
  }
}

function withQuery(path: string, query: Record<string, QueryValue> | undefined): string {
  if (query === undefined) return path;
  const params = new URLSearchParams();
  for (const [key, value] of Object.entries(query)) {
    if (value === undefined) continue;
    if (typeof value === 'object') for (const one of value) params.append(key, one);
    else params.append(key, String(value));
  }
  const search = params.toString();
  return search === '' ? path : `${path}?${search}`;
}

/** Sends one request; resolves when the reply's headers arrived. */
function send(target: Target, method: Method, path: string, headers: http.OutgoingHttpHeaders, body: RequestBody | undefined, call: Call): Promise<IncomingMessage> {
  return new Promise((resolve, reject) => {
    const req = target.request({ hostname: target.hostname, port: target.port, path, method, headers, agent: target.agent }, (res) => {
      call.res = res;
      // Keeps a failure while nobody reads from becoming an uncaught 'error'; readers see `res.errored`.
      res.on('error', ignore);
      resolve(res);
    });
    call.req = req;
    // Stays for the request's life: a socket error after the reply started is emitted here too.
    req.on('error', reject);
    if (body === undefined) req.end();
    else if (typeof body === 'string' || body instanceof Uint8Array) req.end(body);
    else void writeStream(req, body);
  });
}

/** Sends one request by a transport other than HTTP; cancelling the call aborts it. */
async function sendBy(transport: Transport, request: Omit<TransportRequest, 'signal'>, call: Call): Promise<TransportReply> {
  const controller = new AbortController();
  call.req = { destroy: (error?: Error) => controller.abort(error) };
  let onAbort: (() => void) | undefined;
  const cancelled = new Promise<never>((_resolve, reject) => {
    onAbort = () => reject(controller.signal.reason as Error);
    controller.signal.addEventListener('abort', onAbort, { once: true });
  });
  const sent = transport.send({ ...request, signal: controller.signal });
  try {
    const res = await Promise.race([sent, cancelled]);
    call.res = res;
    res.on('error', ignore);
    return res;
  } catch (error) {
    // Cancelled before the headers: a reply that comes later is dropped unread.
    sent.then((late) => late.destroy(), ignore);
    throw error;
  } finally {
    if (onAbort) controller.signal.removeEventListener('abort', onAbort);
  }
}

/** Writes a streamed body with backpressure; a failing source fails the request with its error. */
async function writeStream(req: ClientRequest, source: AsyncIterable<Uint8Array>): Promise<void> {
  try {
    for await (const chunk of source) {
      if (req.destroyed) return;
      if (!req.write(chunk)) await drained(req);
    }
    req.end();
  } catch (error) {
    req.destroy(error instanceof Error ? error : new Error(String(error)));
  }
}

function drained(req: ClientRequest): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      req.off('drain', done);
      req.off('close', done);
      resolve();
    };
    req.on('drain', done);
    req.on('close', done);
  });
}

