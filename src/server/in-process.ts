import { randomBytes } from 'node:crypto';
import type { IncomingHttpHeaders, OutgoingHttpHeaders } from 'node:http';
import { addAbortSignal, Readable } from 'node:stream';
import type { FastifyBaseLogger } from 'fastify';
import FindMyWay from 'find-my-way';
import { SandboxError } from '../errors/index.js';
import type { Transport, TransportReply, TransportRequest } from '../wire/transport.js';
import { errorAnswer } from './errors.js';
import { linkedSignal } from './linked-signal.js';
import { AnswerError, answerCall, JSON_BODY_LIMIT_BYTES, type AnyRoute, type Answer, type SeamServices } from './route.js';

interface Entry {
  route: AnyRoute;
  services: SeamServices;
}

/** Random bytes drawn ahead for request ids: one `randomBytes` call per 512 ids, not one each (~40 µs). */
const idBytes = { pool: Buffer.alloc(0), offset: 0 };

/** A request id as the server gives one to every request (Fastify's `genReqId`), in-process calls too: 64 random bits. */
export function newRequestId(): string {
  if (idBytes.offset + 8 > idBytes.pool.length) {
    idBytes.pool = randomBytes(4096);
    idBytes.offset = 0;
  }
  const id = idBytes.pool.toString('hex', idBytes.offset, idBytes.offset + 8);
  idBytes.offset += 8;
  return `req_${id}`;
}

/**
 * The seam's routes for calls made in the server's own process (MCP's tools, through the SDK):
 * the same routes with the same authentication, validation, idempotency and audit as over HTTP,
 * without the loopback connection, HTTP's parsing and Fastify's request cycle, which cost a tool
 * call a second request's worth of work (docs/decisions/024-in-process-calls.md). `registerRoute`
 * adds every route that needs no HTTP; the SDK reaches them through `transport()`.
 */
export class SeamCalls {
  private readonly router = FindMyWay({ maxParamLength: 100 });

  add(route: AnyRoute, services: SeamServices): void {
    const entry: Entry = { route, services };
    this.router.on(route.method, route.url, () => undefined, entry);
  }

  /** An SDK transport whose calls are answered here, each with a request id of its own; `log` is where they log. */
  transport(log: FastifyBaseLogger): Transport {
    return { send: (request) => this.send(log, request) };
  }

  private async send(log: FastifyBaseLogger, request: TransportRequest): Promise<TransportReply> {
    const id = newRequestId();
    // As Fastify binds each request's log: what a call logs names its id, which its error tells the caller.
    const callLog = log.child({ reqId: id });
    const found = this.router.find(request.method, request.path);
    if (!found) {
      return errorReply(id, callLog, new SandboxError('NOT_FOUND', `no route ${request.method} ${request.path.split('?')[0] ?? ''} for a call made in-process`, { details: { method: request.method } }));
    }
    const { route, services } = found.store as Entry;
    const reply = new InProcessReply(request.signal, services.closeSignal);
    let body: unknown;
    try {
      body = requestBody(request, route, reply.signal);
      const answer = await answerCall(services, route, {
        method: request.method,
        url: request.path,
        headers: lowerCased(request.headers),
        params: found.params,
        query: found.searchParams,
        body,
        id,
        log: callLog,
        signal: reply.signal,
        origin: request.origin,
      });
      return reply.answer(id, answer);
    } catch (error) {
      reply.release();
      return errorReply(id, callLog, error instanceof AnswerError ? error.error : error, error instanceof AnswerError ? error.headers : {});
    } finally {
      // A streamed body the route did not read to its end (it failed first, or gave up) is ended
      // here, and with it the caller's source: over HTTP the closed request does that.
      if (body instanceof Readable && !body.readableEnded) body.destroy();
    }
  }
}

/**
 * A reply read by the SDK as it reads an HTTP one. Its signal is the call's: it aborts when the
 * caller cancels, when the server closes, or when the caller stops reading before the end (as a
 * closed connection does).
 */
class InProcessReply {
  private readonly stopped = new AbortController();
  private readonly outer: { signal: AbortSignal; release: () => void };
  private readonly call: { signal: AbortSignal; release: () => void };

  constructor(cancel: AbortSignal, closeSignal: AbortSignal) {
    this.outer = linkedSignal(cancel, closeSignal);
    this.call = linkedSignal(this.stopped.signal, this.outer.signal);
  }

  get signal(): AbortSignal {
    return this.call.signal;
  }

  release(): void {
    this.call.release();
    this.outer.release();
  }

  answer(id: string, answer: Answer): TransportReply {
    const headers: IncomingHttpHeaders = { 'x-request-id': id, ...answer.headers };
    switch (answer.kind) {
      case 'json':
        return this.reply(answer.status, { ...headers, 'content-type': 'application/json' }, [Buffer.from(JSON.stringify(answer.body))]);
      case 'empty':
        return this.reply(answer.status, headers, []);
      case 'bytes':
        return this.reply(answer.status, { ...headers, 'content-type': answer.contentType }, answer.stream);
      case 'lines':
        // Each line a chunk of its own: HTTP's coalescing saves packets and wakeups, here there are none to save.
        return this.reply(answer.status, { ...headers, 'content-type': answer.contentType }, answer.lines);
      case 'write':
        // Only /v1 routes are kept here, and none answers in a protocol of its own (were one to,
        // its outcome would already be recorded as a success: the seam settles before this).
        this.release();
        throw new SandboxError('INTERNAL', 'this call answers in a protocol of its own, over HTTP only');
    }
  }

  /**
   * The body, read straight from `source`. Destroying it before its end (the caller stopped
   * reading) aborts the call at once, as a closed connection does: the route's stream ends on its
   * signal, not at its next event, which on a quiet stream may never come.
   */
  private reply(status: number, headers: IncomingHttpHeaders, source: Iterable<Buffer> | AsyncIterable<Buffer | string>): TransportReply {
    return byteReply(status, headers, source, (complete) => {
      if (!complete) this.stopped.abort(new Error('the caller stopped reading the reply'));
      this.release();
    });
  }
}

/** A reply whose body is `source` as bytes; `stopped` runs once when it is destroyed, saying whether it had come whole. */
function byteReply(status: number, headers: IncomingHttpHeaders, source: Iterable<Buffer> | AsyncIterable<Buffer | string>, stopped: (complete: boolean) => void): TransportReply {
  const iterator = Symbol.asyncIterator in source ? source[Symbol.asyncIterator]() : source[Symbol.iterator]();
  const stream = new Readable({
    read() {
      Promise.resolve(iterator.next()).then(
        (next) => {
          if (!next.done) return void this.push(next.value);
          reply.complete = true;
          this.push(null);
        },
        (error: unknown) => this.destroy(error as Error),
      );
    },
    destroy(error, callback) {
      stopped(reply.complete);
      void Promise.resolve(iterator.return?.()).catch(() => undefined);
      callback(error);
    },
  });
  const reply = Object.assign(stream, { statusCode: status, headers, complete: false });
  return reply;
}

/** An error as the HTTP seam answers it: its status, `Retry-After`, the wire body with the call's id. */
function errorReply(id: string, log: FastifyBaseLogger, error: unknown, extra: Record<string, string> = {}): TransportReply {
  const { status, headers, body } = errorAnswer(log, id, error);
  return Object.assign(Readable.from([Buffer.from(JSON.stringify(body))], { objectMode: false }), {
    statusCode: status,
    headers: { 'x-request-id': id, 'content-type': 'application/json', ...headers, ...extra },
    complete: true,
  });
}

function lowerCased(headers: OutgoingHttpHeaders): IncomingHttpHeaders {
  const out: IncomingHttpHeaders = {};
  for (const [name, value] of Object.entries(headers)) {
    if (value !== undefined) out[name.toLowerCase()] = typeof value === 'number' ? String(value) : value;
  }
  return out;
}

/**
 * The body as Fastify would hand it to the seam: JSON parsed (within the route's limit), raw
 * bytes as a stream, nothing as undefined.
 */
function requestBody(request: TransportRequest, route: AnyRoute, signal: AbortSignal): unknown {
  const { body } = request;
  if (body === undefined) return undefined;
  const type = String(request.headers['content-type'] ?? '');
  if (!type.startsWith('application/json')) {
    if (signal.aborted) throw new SandboxError('ABORTED', 'the call was cancelled, or the server is closing, before its body was read');
    const stream = typeof body === 'string' || body instanceof Uint8Array ? Readable.from([Buffer.from(body)]) : Readable.from(body);
    // Until the route reads it (after authentication and validation) nobody listens: a cut then
    // is the route's to see, never an uncaught error. Ended with the call (a cancel, a server
    // close), as the request stream of a closed connection is.
    stream.on('error', () => undefined);
    return addAbortSignal(signal, stream);
  }
  const text = typeof body === 'string' ? body : body instanceof Uint8Array ? Buffer.from(body).toString('utf8') : undefined;
  if (text === undefined) throw new SandboxError('INVALID_ARGUMENT', 'a JSON body must be sent whole', { details: { field: 'body' } });
  const limit = route.bodyLimitBytes ?? JSON_BODY_LIMIT_BYTES;
  if (Buffer.byteLength(text) > limit) {
    throw new SandboxError('PAYLOAD_TOO_LARGE', `the request body is larger than the ${limit} bytes a JSON body may be`, { details: { field: 'body', limitBytes: limit } });
  }
  try {
    return JSON.parse(text) as unknown;
  } catch (error) {
    throw new SandboxError('INVALID_ARGUMENT', `the request is malformed: ${(error as Error).message}`, { details: { field: 'body' } });
  }
}
