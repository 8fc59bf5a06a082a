import http, { type ClientRequest, type IncomingHttpHeaders, type IncomingMessage } from 'node:http';
import https from 'node:https';
import { AbortedError, CapsuleError, ConnectionError, TimeoutError, errorFromResponse } from './errors.js';
import type { ResolvedConfig } from './config.js';
import type { CallOptions } from './types.js';

export type Method = 'GET' | 'POST' | 'PUT' | 'DELETE';
export type QueryValue = string | number | boolean | readonly string[] | undefined;

/** A request body: replayable when it is bytes or a string; a stream is sent once, as it is read. */
export type RequestBody = Uint8Array | string | AsyncIterable<Uint8Array>;

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

/** An open reply whose body the caller reads; `close()` stops it and frees the connection. */
export interface OpenResponse {
  readonly status: number;
  readonly headers: IncomingHttpHeaders;
  /**
   * The body chunk by chunk, straight from the socket; errors while reading are typed
   * CapsuleErrors. Read it once (with `chunks()` or `stream()`).
   */
  chunks(): AsyncGenerator<Uint8Array, void, undefined>;
  /** The body as a web stream (for callers that asked for one); cancelling it frees the connection. */
  stream(): ReadableStream<Uint8Array>;
  /**
   * Ends the call. A body that already arrived whole is drained so the connection is kept for
   * the next call; one still arriving is cut off.
   */
  close(): void;
  /**
   * Ends the call after its last expected line (an `exit`, an `end`): the body's end is read
   * when it comes within a moment, so the connection is kept; else it is cut off then.
   */
  finish(): void;
}

const RETRY_STATUSES = new Set([502, 503]);
const USER_AGENT = 'capsule-sdk/0.1.0';
const ACCEPT = 'application/json, application/x-ndjson';
/** Sockets per server; more concurrent calls wait for a free one. */
const MAX_SOCKETS = 64;
/**
 * An idle kept-alive socket is closed after this long (sooner when the server's `Keep-Alive`
 * header asks). Idle sockets are unref'd by Node, so they never keep a script's process alive.
 */
const IDLE_SOCKET_MS = 30_000;
/** How long `finish()` waits for the end of a body whose last line was read. */
const FINISH_GRACE_MS = 1_000;

/**
 * One keep-alive agent per server origin, shared by every client of the process: `Sandbox.list`,
 * `Sandbox.create` and each sandbox's calls reuse the same few connections, and the socket count
 * stays bounded however many Sandbox objects exist. This is the SDK's one piece of module state: a
 * cache of connection pools, like Node's own `http.globalAgent`.
 */
const AGENTS = new Map<string, http.Agent>();

function agentFor(url: URL): http.Agent {
  const existing = AGENTS.get(url.origin);
  if (existing) return existing;
  const options: http.AgentOptions = { keepAlive: true, maxSockets: MAX_SOCKETS, timeout: IDLE_SOCKET_MS, noDelay: true };
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
 * failed or the server answered 502/503: the server's idempotency makes the retry safe.
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
  private async exchange(options: RequestOptions, wholeCall: boolean): Promise<{ res: IncomingMessage; call: Call }> {
    const what = `${options.method} ${options.path}`;
    if (options.signal?.aborted) throw aborted(what, options.signal.reason);
    const target = (this.parsed ??= this.target());
    const headers: http.OutgoingHttpHeaders = { 'user-agent': USER_AGENT, accept: ACCEPT };
    if (this.config.apiKey !== undefined) headers.authorization = `Bearer ${this.config.apiKey}`;
    if (options.method !== 'GET') headers['idempotency-key'] = crypto.randomUUID();
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
    const path = target.prefix + withQuery(options.path, options.query);
    const timeoutMs = options.timeoutMs ?? this.config.timeoutMs;
    for (let attempt = 1; ; attempt++) {
      const call = new Call(options.signal, timeoutMs);
      let res: IncomingMessage;
      try {
        res = await send(target, options.method, path, headers, body, call);
      } catch (error) {
        call.release();
        const typed = toCapsuleError(error, what, this.config.url, call);
        if (attempt === 1 && replayable && typed instanceof ConnectionError) continue;
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
      if (attempt === 1 && replayable && (RETRY_STATUSES.has(status) || error instanceof ConnectionError)) continue;
      throw error;
    }
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

/** One attempt's request and reply, its deadline and the caller's signal; `release()` unhooks both. */
class Call {
  req: ClientRequest | undefined;
  res: IncomingMessage | undefined;
  timedOut = false;
  private timer: NodeJS.Timeout | undefined;
  private readonly onAbort: (() => void) | undefined;

  constructor(
    readonly outer: AbortSignal | undefined,
    readonly timeoutMs: number,
  ) {
    // 0 (or Infinity) means no deadline: the caller's signal alone ends the call.
    if (timeoutMs > 0 && Number.isFinite(timeoutMs)) {
      this.timer = setTimeout(() => {
        this.timedOut = true;
        this.cancel('deadline');
      }, timeoutMs);
    }
    if (outer) {
      this.onAbort = () => this.cancel('aborted');
      outer.addEventListener('abort', this.onAbort, { once: true });
    }
  }

  /** Cuts the call off: the request, and the reply if it is still arriving. */
  cancel(why: string): void {
    const error = new Error(`the call was cancelled (${why})`);
    if (this.res && !this.res.readableEnded) this.res.destroy(error);
    this.req?.destroy(error);
  }

  stopDeadline(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
  }

  release(): void {
    this.stopDeadline();
    if (this.onAbort) this.outer?.removeEventListener('abort', this.onAbort);
  }
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

function ignore(): void {}

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

/** Reads a whole reply body as Buffer chunks, joined once at the end. */
function collect(res: IncomingMessage, call: Call): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    if (res.destroyed) return reject(res.errored ?? prematureClose(call));
    const chunks: Buffer[] = [];
    res.on('data', (chunk: Buffer) => chunks.push(chunk));
    res.on('end', () => resolve(chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks)));
    res.on('close', () => {
      if (!res.readableEnded) reject(res.errored ?? prematureClose(call));
    });
  });
}

function prematureClose(call: Call): Error {
  return Object.assign(new Error(call.timedOut || call.outer?.aborted ? 'cancelled' : 'the reply ended early'), { code: 'ECONNRESET' });
}

async function readError(res: IncomingMessage, call: Call): Promise<CapsuleError> {
  const text = (await collect(res, call)).toString('utf8');
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    parsed = undefined;
  }
  const requestId = res.headers['x-request-id'];
  return errorFromResponse(res.statusCode ?? 0, parsed, typeof requestId === 'string' ? requestId : undefined);
}

/** A 2xx reply whose body streams; see `OpenResponse`. */
class OpenReply implements OpenResponse {
  private closed = false;

  constructor(
    private readonly res: IncomingMessage,
    private readonly call: Call,
    private readonly baseUrl: string,
  ) {}

  get status(): number {
    return this.res.statusCode ?? 0;
  }

  get headers(): IncomingHttpHeaders {
    return this.res.headers;
  }

  async *chunks(): AsyncGenerator<Uint8Array, void, undefined> {
    const res = this.res;
    let wake: (() => void) | undefined;
    const onEvent = () => {
      const resume = wake;
      wake = undefined;
      resume?.();
    };
    res.on('readable', onEvent);
    res.on('end', onEvent);
    res.on('close', onEvent);
    try {
      for (;;) {
        const chunk = res.read() as Buffer | null;
        if (chunk !== null) {
          yield chunk;
          continue;
        }
        if (res.readableEnded) return;
        if (res.destroyed) throw res.errored ?? prematureClose(this.call);
        await new Promise<void>((resolve) => (wake = resolve));
      }
    } catch (error) {
      throw toCapsuleError(error, 'reading the reply', this.baseUrl, this.call);
    } finally {
      res.off('readable', onEvent);
      res.off('end', onEvent);
      res.off('close', onEvent);
    }
  }

  stream(): ReadableStream<Uint8Array> {
    const res = this.res;
    let detach = () => {};
    return new ReadableStream<Uint8Array>({
      start: (controller) => {
        const fail = () => {
          this.close();
          controller.error(toCapsuleError(res.errored ?? prematureClose(this.call), 'reading the reply', this.baseUrl, this.call));
        };
        if (res.destroyed && !res.readableEnded) return fail();
        const onData = (chunk: Buffer) => {
          // A copy: the web stream's reader owns its chunks, as with fetch.
          controller.enqueue(new Uint8Array(chunk));
          if ((controller.desiredSize ?? 0) <= 0) res.pause();
        };
        const onEnd = () => {
          detach();
          this.close();
          controller.close();
        };
        const onClose = () => {
          if (res.readableEnded) return;
          detach();
          fail();
        };
        res.on('data', onData);
        res.on('end', onEnd);
        res.on('close', onClose);
        detach = () => {
          res.off('data', onData);
          res.off('end', onEnd);
          res.off('close', onClose);
        };
      },
      pull: () => {
        res.resume();
      },
      cancel: () => {
        // Unhooked first: a body that arrived whole is drained after this, past a cancelled stream.
        detach();
        this.close();
      },
    });
  }

  close(): void {
    this.end(false);
  }

  finish(): void {
    this.end(true);
  }

  private end(endIsNear: boolean): void {
    if (this.closed) return;
    this.closed = true;
    this.call.release();
    const res = this.res;
    if (res.readableEnded || res.destroyed) return;
    if (!res.complete && !endIsNear) {
      res.destroy();
      return;
    }
    // Reading the rest to its end hands the socket back to the pool for the next call.
    if (!res.complete) {
      const cutOff = setTimeout(() => res.destroy(), FINISH_GRACE_MS).unref();
      res.once('close', () => clearTimeout(cutOff));
    }
    // A 'data' listener (not resume()) makes it flow also when a reader's 'readable' listener is
    // still being removed in this tick: Node then resumes the stream once that removal settles.
    res.on('data', ignore);
  }
}

function aborted(what: string, cause: unknown): AbortedError {
  return new AbortedError('ABORTED', `${what} was aborted by the caller's AbortSignal`, { cause });
}

/** Turns what node:http failed with into a typed error: aborted, timed out, or unreachable. */
function toCapsuleError(error: unknown, what: string, baseUrl: string, call: Call): CapsuleError {
  if (error instanceof CapsuleError) return error;
  if (call.outer?.aborted) return aborted(what, error);
  if (call.timedOut) {
    return new TimeoutError('TIMEOUT', `${what} got no reply from ${baseUrl} within ${call.timeoutMs} ms`, {
      cause: error,
      hint: 'Raise timeoutMs, or check that the Capsule server is not overloaded.',
      details: { timeoutMs: call.timeoutMs },
    });
  }
  return new ConnectionError('SERVER_UNREACHABLE', `${what}: cannot reach the Capsule server at ${baseUrl} (${reasonOf(error)})`, {
    cause: error,
    hint: 'Start it with `capsule serve`, or point CAPSULE_URL (or the url option) at a running server.',
    details: { url: baseUrl },
  });
}

/** The errno code (ECONNREFUSED) when there is one; connecting to every address of a name fails with several. */
function reasonOf(error: unknown): string {
  const { code, message, errors } = error as { code?: unknown; message?: unknown; errors?: unknown };
  if (typeof code === 'string') return code;
  if (Array.isArray(errors) && errors.length > 0) return reasonOf(errors[0]);
  return typeof message === 'string' ? message : String(error);
}
