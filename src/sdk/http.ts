import { AbortedError, CapsuleError, ConnectionError, TimeoutError, errorFromResponse } from './errors.js';
import type { ResolvedConfig } from './config.js';
import type { CallOptions } from './types.js';

export type Method = 'GET' | 'POST' | 'PUT' | 'DELETE';
export type QueryValue = string | number | boolean | readonly string[] | undefined;

export interface RequestOptions {
  method: Method;
  path: string;
  query?: Record<string, QueryValue>;
  /** Sent as JSON. */
  json?: unknown;
  /** Sent as `application/octet-stream`. A stream body is sent once: it cannot be replayed. */
  body?: Uint8Array | string | ReadableStream<Uint8Array>;
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
  response: Response;
  /** The body as a stream; errors while reading it are already typed CapsuleErrors. */
  body: ReadableStream<Uint8Array>;
  close(): void;
}

const RETRY_STATUSES = new Set([502, 503]);
const USER_AGENT = 'capsule-sdk/0.1.0';

/**
 * The one place the SDK talks HTTP. Mutating calls carry a fresh `Idempotency-Key`, and every
 * call is retried once, with the same key, when the connection failed or the server answered
 * 502/503: the server's idempotency makes the retry safe.
 */
export class HttpClient {
  constructor(readonly config: ResolvedConfig) {}

  /** Sends a request and returns its JSON reply (undefined for 204). */
  async json<T>(options: RequestOptions): Promise<T> {
    const open = await this.open(options, true);
    try {
      const text = await readText(open.body);
      return (text === '' ? undefined : JSON.parse(text)) as T;
    } finally {
      open.close();
    }
  }

  /** Sends a request and returns the reply's bytes. */
  async bytes(options: RequestOptions): Promise<Uint8Array> {
    const open = await this.open(options, true);
    try {
      return new Uint8Array(await new Response(open.body).arrayBuffer());
    } catch (error) {
      throw toCapsuleError(error, 'reading the reply', this.config.url, options.signal);
    } finally {
      open.close();
    }
  }

  /**
   * Sends a request and hands back the reply once its headers arrived. `wholeCall` keeps the
   * deadline running until `close()`; otherwise it ends when the headers arrive (streams).
   */
  async open(options: RequestOptions, wholeCall = false): Promise<OpenResponse> {
    const url = this.url(options.path, options.query);
    const headers: Record<string, string> = { 'user-agent': USER_AGENT, accept: 'application/json, application/x-ndjson' };
    if (this.config.apiKey !== undefined) headers.authorization = `Bearer ${this.config.apiKey}`;
    if (options.method !== 'GET') headers['idempotency-key'] = crypto.randomUUID();
    let body: string | Uint8Array | ReadableStream<Uint8Array> | undefined;
    if (options.json !== undefined) {
      headers['content-type'] = 'application/json';
      body = JSON.stringify(options.json);
    } else if (options.body !== undefined) {
      headers['content-type'] = 'application/octet-stream';
      body = options.body;
    }
    const replayable = !(options.body instanceof ReadableStream);
    const timeoutMs = options.timeoutMs ?? this.config.timeoutMs;
    for (let attempt = 1; ; attempt++) {
      const call = new CallSignal(options.signal, timeoutMs);
      try {
        const response = await fetch(url, {
          method: options.method,
          headers,
          body,
          signal: call.signal,
          ...(body instanceof ReadableStream && { duplex: 'half' }),
        });
        if (!wholeCall) call.stopDeadline();
        if (response.ok) return wrap(response, call, this.config.url, options.signal);
        const error = await readError(response);
        call.release();
        if (attempt === 1 && replayable && RETRY_STATUSES.has(response.status)) continue;
        throw error;
      } catch (error) {
        call.release();
        const typed = toCapsuleError(error, `${options.method} ${options.path}`, this.config.url, options.signal, call);
        if (attempt === 1 && replayable && typed instanceof ConnectionError) continue;
        throw typed;
      }
    }
  }

  private url(path: string, query: Record<string, QueryValue> = {}): string {
    const url = new URL(this.config.url + path);
    for (const [key, value] of Object.entries(query)) {
      if (value === undefined) continue;
      const values = typeof value === 'object' ? value : [String(value)];
      for (const one of values) url.searchParams.append(key, one);
    }
    return url.toString();
  }
}

/** Joins the caller's signal with the call's deadline; `release()` drops both. */
class CallSignal {
  private readonly controller = new AbortController();
  private timer: NodeJS.Timeout | undefined;
  private readonly onAbort: () => void;
  timedOut = false;

  constructor(
    private readonly outer: AbortSignal | undefined,
    readonly timeoutMs: number,
  ) {
    this.onAbort = () => this.controller.abort(outer?.reason);
    if (outer?.aborted) this.controller.abort(outer.reason);
    else outer?.addEventListener('abort', this.onAbort, { once: true });
    // 0 (or Infinity) means no deadline: the caller's signal alone ends the call.
    if (timeoutMs > 0 && Number.isFinite(timeoutMs)) {
      this.timer = setTimeout(() => {
        this.timedOut = true;
        this.controller.abort(new Error('deadline'));
      }, timeoutMs);
    }
  }

  get signal(): AbortSignal {
    return this.controller.signal;
  }

  stopDeadline(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
  }

  /** Ends the call: aborts what is still open and unhooks from the caller's signal. */
  release(): void {
    this.stopDeadline();
    this.outer?.removeEventListener('abort', this.onAbort);
    if (!this.controller.signal.aborted) this.controller.abort(new Error('released'));
  }
}

function wrap(response: Response, call: CallSignal, baseUrl: string, outer: AbortSignal | undefined): OpenResponse {
  const source = response.body;
  let reader: ReadableStreamDefaultReader<Uint8Array> | undefined;
  const body = new ReadableStream<Uint8Array>({
    async pull(controller) {
      if (source === null) return controller.close();
      reader ??= source.getReader();
      try {
        const { done, value } = await reader.read();
        if (done) controller.close();
        else controller.enqueue(value);
      } catch (error) {
        controller.error(toCapsuleError(error, 'reading the reply', baseUrl, outer, call));
      }
    },
    async cancel(reason) {
      await (reader ?? source)?.cancel(reason).catch(() => undefined);
      call.release();
    },
  });
  return { response, body, close: () => call.release() };
}

async function readError(response: Response): Promise<CapsuleError> {
  const text = await response.text().catch(() => '');
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    parsed = undefined;
  }
  return errorFromResponse(response.status, parsed, response.headers.get('x-request-id'));
}

async function readText(body: ReadableStream<Uint8Array>): Promise<string> {
  return new Response(body).text();
}

/** Turns whatever fetch threw into a typed error: aborted, timed out, or unreachable. */
function toCapsuleError(
  error: unknown,
  what: string,
  baseUrl: string,
  outer: AbortSignal | undefined,
  call?: CallSignal,
): CapsuleError {
  if (error instanceof CapsuleError) return error;
  if (outer?.aborted) {
    return new AbortedError('ABORTED', `${what} was aborted by the caller's AbortSignal`, { cause: error });
  }
  if (call?.timedOut) {
    return new TimeoutError('TIMEOUT', `${what} got no reply from ${baseUrl} within ${call.timeoutMs} ms`, {
      cause: error,
      hint: 'Raise timeoutMs, or check that the Capsule server is not overloaded.',
      details: { timeoutMs: call.timeoutMs },
    });
  }
  const cause = (error as { cause?: { code?: string; message?: string } }).cause;
  const reason = cause?.code ?? cause?.message ?? (error as Error).message;
  return new ConnectionError('SERVER_UNREACHABLE', `${what}: cannot reach the Capsule server at ${baseUrl} (${reason})`, {
    cause: error,
    hint: 'Start it with `capsule serve`, or point CAPSULE_URL (or the url option) at a running server.',
    details: { url: baseUrl },
  });
}
