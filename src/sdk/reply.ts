import type { IncomingHttpHeaders } from 'node:http';
import type { TransportReply } from '../wire/transport.js';
import { AbortedError, CapsuleError, ConnectionError, TimeoutError, errorFromResponse } from './errors.js';

/*
 * One call's reply: reading it (whole, or as chunks or a web stream), ending it so that its
 * connection is kept or cut, and turning what node:http failed with into the SDK's typed errors.
 * `HttpClient` (http.ts) makes the calls.
 */

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

/** How long `finish()` waits for the end of a body whose last line was read. */
const FINISH_GRACE_MS = 1_000;

/** One attempt's request and reply, its deadline and the caller's signal; `release()` unhooks both. */
export class Call {
  /** The request in flight (a ClientRequest, or a transport's cancel). */
  req: { destroy(error?: Error): unknown } | undefined;
  res: TransportReply | undefined;
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

export function ignore(): void {}

/** Reads a whole reply body as Buffer chunks, joined once at the end. */
export function collect(res: TransportReply, call: Call): Promise<Buffer> {
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

export async function readError(res: TransportReply, call: Call): Promise<CapsuleError> {
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
export class OpenReply implements OpenResponse {
  private closed = false;

  constructor(
    private readonly res: TransportReply,
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

export function aborted(what: string, cause: unknown): AbortedError {
  return new AbortedError('ABORTED', `${what} was aborted by the caller's AbortSignal`, { cause });
}

/** Turns what node:http failed with into a typed error: aborted, timed out, or unreachable. */
export function toCapsuleError(error: unknown, what: string, baseUrl: string, call: Call): CapsuleError {
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
