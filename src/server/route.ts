import type { IncomingHttpHeaders } from 'node:http';
import { PassThrough, Readable } from 'node:stream';
import type { FastifyBaseLogger, FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { z } from 'zod';
import { SandboxError } from '../errors/index.js';
import type { ApiKeyStore, AuditLog, OperationStore, StoredResponse } from '../store/index.js';
import { authenticate, type AuthLevel, type KeyVerifier, type Principal } from './auth.js';
import { invalidRequest, toSandboxError } from './errors.js';
import { beginIdempotent, type Idempotency, type Replay } from './idempotency.js';
import { AuditTrail, type AuditSubject } from './audit-trail.js';
import { linkedSignal } from './linked-signal.js';

/** JSON bodies, over HTTP and in-process; file contents and stdin are streamed and bounded by the sandbox's limits. */
export const JSON_BODY_LIMIT_BYTES = 1024 * 1024;

/** What a handler returns; the seam turns it into the HTTP response. */
export type RouteResult =
  | { kind: 'json'; status: number; body: unknown; headers?: Record<string, string> }
  | { kind: 'empty'; status: number; headers?: Record<string, string> }
  | { kind: 'raw'; status: number; stream: Readable; contentType: string }
  | {
      kind: 'ndjson';
      status: number;
      /** The lines to send (JSON objects). */
      events: AsyncIterable<object>;
      /**
       * The event that ends the stream, even when the client has gone away (a foreground exec's
       * exit). It is the operation's stored result and the audit outcome; its line is sent only
       * after both are written.
       */
      final?: Promise<{ type: string }>;
    }
  | {
      /**
       * A response in a protocol of its own (Connect envelopes, E2B's code-interpreter lines):
       * `write` sends it on the hijacked reply and resolves when it ended. With `final` the
       * audit outcome and the stored result are written when that settles, else once it starts.
       */
      kind: 'stream';
      write(reply: FastifyReply): Promise<void>;
      final?: Promise<{ type: string }>;
    };

/**
 * Who a call is from when a route authenticates its own way (the E2B facade's keys and access
 * tokens). Throws the surface's own error when the credential is missing or wrong.
 */
export type Authenticate = (request: FastifyRequest) => Principal;

export interface RouteContext<P, Q, B> {
  params: P;
  query: Q;
  body: B;
  principal: Principal;
  requestId: string;
  /** Aborted when the client goes away or the server closes. */
  signal: AbortSignal;
  headers: IncomingHttpHeaders;
  /** Where the caller reached the server (`http://host:port`): the base of URLs handed back. */
  origin: string;
  /** The HTTP request; absent for a call made in-process (`SeamCalls`), which only routes HTTP does not need get. */
  request?: FastifyRequest;
  log: FastifyBaseLogger;
}

export interface ResponseDoc {
  description: string;
  schema?: z.ZodType;
  /** @default 'application/json' */
  contentType?: string;
}

export interface RouteDefinition<P = unknown, Q = unknown, B = unknown> {
  /** Stable operation name, used in the audit log and as the OpenAPI operationId. */
  name: string;
  method: 'GET' | 'POST' | 'PUT' | 'DELETE' | 'PATCH' | 'HEAD' | 'OPTIONS';
  /** Fastify path, e.g. `/v1/sandboxes/:sandboxId`. */
  url: string;
  summary: string;
  auth: AuthLevel | Authenticate;
  /** Fastify route constraints (the E2B facade routes by its port header). */
  constraints?: Record<string, string>;
  params?: z.ZodType<P>;
  query?: z.ZodType<Q>;
  body?: z.ZodType<B>;
  /** The body is raw bytes, handed over as a stream (never buffered). */
  rawBody?: boolean;
  /** A JSON body may be this large (a template build's inline context). @default 1 MiB */
  bodyLimitBytes?: number;
  /**
   * The request belongs to another server (a sandbox's port): its body is left unread in
   * `request.raw` for the handler to forward, and its headers carry no meaning for the seam (an
   * `Idempotency-Key` is the app's, not Capsule's). Authentication and the audit still apply.
   */
  passThrough?: boolean;
  /** The body schema shown in OpenAPI when it differs from the one validated here. */
  bodyDoc?: z.ZodType;
  /** For OpenAPI; routes of another API's shape (the E2B facade) are documented by that API. */
  responses?: Record<number, ResponseDoc>;
  /**
   * The call acts inside a sandbox (its processes, files, code, ports; envd): before the handler,
   * a paused sandbox created with `autoResume` is resumed. The sandbox is the principal's (an envd
   * access token) or the `sandboxId` path parameter.
   */
  wakes?: boolean;
  /** What an idempotent replay returns instead of the body, when the body holds a secret. */
  replayBody?(body: unknown): unknown;
  /** Present on audited routes: what to record. Runs before the attempt record is written. */
  audit?(context: RouteContext<P, Q, B>): AuditSubject;
  handler(context: RouteContext<P, Q, B>): RouteResult | Promise<RouteResult>;
}

export type AnyRoute = RouteDefinition<unknown, unknown, unknown>;

/**
 * The HTTP request of a route that needs it (it authenticates its own way, forwards a body,
 * reads the Host). Such routes are never called in-process, so its absence is a bug.
 */
export function httpOnly(request: FastifyRequest | undefined): FastifyRequest {
  if (!request) throw new SandboxError('INTERNAL', 'this call answers over HTTP only, and came in-process');
  return request;
}

/** Keeps a route's types while letting routes of different shapes share one list. */
export function defineRoute<P, Q, B>(route: RouteDefinition<P, Q, B>): AnyRoute {
  return route;
}

export interface SeamServices {
  keys: ApiKeyStore;
  /** The web console's short-lived session keys, accepted wherever an API key is. */
  sessions?: KeyVerifier;
  operations: OperationStore;
  audit: AuditLog;
  /** Aborted when the server closes: ends streams that would otherwise never end (watch). */
  closeSignal: AbortSignal;
  atomically<T>(fn: () => T): T;
  /** Resumes a paused sandbox created with `autoResume` (SandboxEngine.wake); routes with `wakes` call it. */
  wake?(tenantId: string, sandboxId: string): Promise<void>;
  /** Where the routes that need no HTTP are also kept, for calls made in-process (`in-process.ts`). */
  calls?: { add(route: AnyRoute, services: SeamServices): void };
}

/**
 * One call as the seam sees it, whichever way it came (HTTP, or in-process): its method, URL and
 * headers, its parts as parsed (still unvalidated), its id, log and signal.
 */
export interface SeamRequest {
  method: string;
  url: string;
  headers: IncomingHttpHeaders;
  params: unknown;
  query: unknown;
  body: unknown;
  id: string;
  log: FastifyBaseLogger;
  signal: AbortSignal;
  /** Where the caller reached the server (`http://host:port`). */
  origin: string;
  http?: FastifyRequest;
}

/**
 * What a call answers, before a transport writes it: a JSON value, NDJSON lines, a byte stream,
 * or a write of the route's own on the HTTP reply (`stream` results; those answer over HTTP only).
 */
export type Answer = { status: number; headers: Record<string, string> } & (
  | { kind: 'json'; body: unknown }
  | { kind: 'empty' }
  | { kind: 'lines'; contentType: string; lines: AsyncIterable<string> }
  | { kind: 'bytes'; contentType: string; stream: Readable }
  | { kind: 'write'; write(reply: FastifyReply): Promise<void> }
);

/** A call that ends in an error, with headers of its own (an idempotent replay's). */
export class AnswerError extends Error {
  constructor(
    readonly error: unknown,
    readonly headers: Record<string, string>,
  ) {
    super('answered with an error');
  }
}

const ANONYMOUS: Principal = { tenantId: '', keyId: '', isAdmin: false, grants: { mountRoots: [] } };

/**
 * The one seam every request passes: authentication, validation, idempotency and the audit
 * trail, then the thin handler. Routes never repeat any of these.
 */
export function registerRoute(app: FastifyInstance, services: SeamServices, route: AnyRoute): void {
  app.route({
    method: route.method,
    url: route.url,
    ...(route.constraints ? { constraints: route.constraints } : {}),
    ...(route.bodyLimitBytes ? { bodyLimit: route.bodyLimitBytes } : {}),
    handler: (request, reply) => serve(services, route, request, reply),
  });
  if (needsNoHttp(route)) services.calls?.add(route, services);
}

/**
 * A route that a call made in-process (the SDK's, in the server) can reach: one of the API's
 * (`/v1`) that authenticates by API key, reads no request of another server (a sandbox's port)
 * and is not routed by a header. The other surfaces (E2B's, MCP itself) answer over HTTP only.
 */
function needsNoHttp(route: AnyRoute): boolean {
  return route.url.startsWith('/v1/') && typeof route.auth !== 'function' && route.passThrough !== true && route.constraints === undefined;
}

function principalOf(route: AnyRoute, call: SeamRequest, services: SeamServices): Principal {
  if (typeof route.auth === 'function') return route.auth(httpOnly(call.http));
  return route.auth === 'none' ? ANONYMOUS : authenticate(call, services.keys, route.auth, services.sessions);
}

async function serve(services: SeamServices, route: AnyRoute, request: FastifyRequest, reply: FastifyReply): Promise<FastifyReply> {
  const signal = requestSignal(reply, services.closeSignal);
  const call: SeamRequest = {
    method: request.method,
    url: request.url,
    headers: request.headers,
    params: request.params,
    query: request.query ?? {},
    body: request.body,
    id: request.id,
    log: request.log,
    signal,
    origin: `${request.protocol}://${request.host}`,
    http: request,
  };
  let answer: Answer;
  try {
    answer = await answerCall(services, route, call);
  } catch (error) {
    if (!(error instanceof AnswerError)) throw error;
    reply.headers(error.headers);
    throw error.error;
  } finally {
    if (route.rawBody) drainUnread(request.body, reply);
  }
  return writeAnswer(reply, answer);
}

/** Writes an answer on the HTTP reply. */
function writeAnswer(reply: FastifyReply, answer: Answer): FastifyReply | Promise<FastifyReply> {
  // A route's own protocol writes its own status and headers on the hijacked reply.
  if (answer.kind === 'write') return answer.write(reply).then(() => reply);
  reply.code(answer.status);
  reply.headers(answer.headers);
  switch (answer.kind) {
    case 'json':
      return reply.type('application/json').send(answer.body);
    case 'empty':
      return reply.send();
    case 'bytes':
      return reply.type(answer.contentType).send(answer.stream);
    case 'lines': {
      // Headers go out with the first lines when those are ready at once (an exec's start), else
      // as soon as the stream has to wait: a client of a quiet watch knows it is established.
      const stream = coalesce(answer.lines, () => {
        if (!reply.raw.headersSent) reply.raw.flushHeaders();
      });
      return reply.type(answer.contentType).send(stream);
    }
  }
}

/**
 * The seam's work for one call, whichever transport brought it: who it is from, its validated
 * parts, its idempotency key and audit attempt (committed together), the handler, and the
 * outcome recorded as the answer is settled. Throws what the call fails with.
 */
export async function answerCall(services: SeamServices, route: AnyRoute, call: SeamRequest): Promise<Answer> {
  const principal = principalOf(route, call, services);
  const context: RouteContext<unknown, unknown, unknown> = {
    params: parsePart('params', route.params, call.params),
    query: parsePart('query', route.query, call.query),
    body: route.passThrough ? undefined : route.rawBody ? rawBody(call.body) : parsePart('body', route.body, jsonBody(call.body, route.body !== undefined)),
    principal,
    requestId: call.id,
    signal: call.signal,
    headers: call.headers,
    origin: call.origin,
    ...(call.http && { request: call.http }),
    log: call.log,
  };

  // The key's claim and the audit attempt commit together: if the attempt cannot be written,
  // the key is not claimed either and a retry runs the call. A call with neither writes nothing.
  const trail = new AuditTrail(services.audit, route.name, principal, call.id);
  const keyed = route.method !== 'GET' && route.passThrough !== true && call.headers['idempotency-key'] !== undefined;
  const claim = () => {
    const claimed = keyed ? beginIdempotent(services.operations, call, principal, context.body, route.rawBody === true) : undefined;
    if (claimed?.kind !== 'replay' && route.audit) trail.attempt(route.audit(context));
    return claimed;
  };
  const begun = keyed || route.audit ? services.atomically(claim) : undefined;
  if (begun?.kind === 'replay') return replayed(begun);
  const idempotency = begun?.idempotency;

  let result: RouteResult;
  try {
    if (route.wakes) await wakeSandbox(services, context);
    result = await route.handler(context);
  } catch (error) {
    trail.failed(error);
    idempotency?.fail(error, call.id);
    throw error;
  }
  return settleResult(services, result, trail, idempotency, call, route);
}

/** The stored answer of an idempotent replay (its error rethrown, so each surface renders it its own way). */
function replayed(replay: Replay): Answer {
  const headers = { 'idempotent-replayed': 'true' };
  if (replay.error) throw new AnswerError(replay.error, headers);
  const { stored } = replay;
  if (stored.contentType === 'application/x-ndjson') {
    return { status: stored.status, headers, kind: 'lines', contentType: stored.contentType, lines: Readable.from([`${JSON.stringify(stored.body)}\n`]) };
  }
  return stored.body === null ? { status: stored.status, headers, kind: 'empty' } : { status: stored.status, headers, kind: 'json', body: stored.body };
}

/** The sandbox a `wakes` route acts in, resumed first when it was paused with `autoResume`. */
async function wakeSandbox(services: SeamServices, context: RouteContext<unknown, unknown, unknown>): Promise<void> {
  const fromParams = (context.params as { sandboxId?: unknown } | undefined)?.sandboxId;
  const sandboxId = context.principal.sandboxId ?? (typeof fromParams === 'string' ? fromParams : undefined);
  if (sandboxId !== undefined) await services.wake?.(context.principal.tenantId, sandboxId);
}

function settleResult(
  services: SeamServices,
  result: RouteResult,
  trail: AuditTrail,
  idempotency: Idempotency | undefined,
  call: SeamRequest,
  route: AnyRoute,
): Answer {
  const requestId = call.id;
  switch (result.kind) {
    case 'json':
    case 'empty': {
      const body = result.kind === 'json' ? result.body : null;
      settle(services, trail, idempotency, requestId, () => trail.succeeded(sandboxIdOf(body)), {
        status: result.status,
        body: route.replayBody ? route.replayBody(body) : body,
        contentType: 'application/json',
      });
      const headers = result.headers ?? {};
      return result.kind === 'json' ? { status: result.status, headers, kind: 'json', body } : { status: result.status, headers, kind: 'empty' };
    }
    case 'raw':
      settle(services, trail, idempotency, requestId, () => trail.succeeded(), { status: result.status, body: null, contentType: result.contentType });
      return { status: result.status, headers: {}, kind: 'bytes', contentType: result.contentType, stream: result.stream };
    case 'ndjson': {
      // A stream without a final event (watch, reattach) succeeded once it is open.
      if (!result.final) settle(services, trail, idempotency, requestId, () => trail.succeeded());
      const settled = result.final?.then((event) => {
        settle(services, trail, idempotency, requestId, () => trail.succeeded(undefined, event), { status: result.status, body: event, contentType: 'application/x-ndjson' });
        return event;
      }, (error: unknown) => {
        trail.failed(error);
        idempotency?.fail(error, requestId);
        throw error;
      });
      settled?.catch((error: unknown) => call.log.warn({ err: error }, 'stream ended without its final event'));
      return { status: result.status, headers: {}, kind: 'lines', contentType: 'application/x-ndjson', lines: ndjson(result.events, settled, requestId, call.log) };
    }
    case 'stream': {
      if (!result.final) settle(services, trail, idempotency, requestId, () => trail.succeeded());
      result.final?.then(
        (event) => settle(services, trail, idempotency, requestId, () => trail.succeeded(undefined, event)),
        (error: unknown) => {
          trail.failed(error);
          idempotency?.fail(error, requestId);
        },
      ).catch((error: unknown) => call.log.warn({ err: error }, 'stream ended without its outcome recorded'));
      return { status: 200, headers: {}, kind: 'write', write: (reply) => result.write(reply) };
    }
  }
}

/**
 * Writes the audit outcome and stores the response under the Idempotency-Key in one
 * transaction. The outcome must be written before success is reported: if it cannot be, the
 * call fails, and since its work is done, the key keeps that failure with `effect: "unknown"`
 * (a retry must not run the work again).
 */
function settle(
  services: SeamServices,
  trail: AuditTrail,
  idempotency: Idempotency | undefined,
  requestId: string,
  outcome: () => void,
  response?: StoredResponse,
): void {
  if (!idempotency && !trail.recording) return;
  try {
    services.atomically(() => {
      outcome();
      if (response) idempotency?.complete(response);
    });
  } catch (error) {
    const failure = withUnknownEffect(error);
    idempotency?.fail(failure, requestId);
    throw failure;
  }
}

function withUnknownEffect(error: unknown): SandboxError {
  const wire = toSandboxError(error);
  if (wire.details?.effect === 'unknown') return wire;
  return new SandboxError('INTERNAL', 'the result of this call could not be recorded; treat its effect as unknown', {
    details: { effect: 'unknown' },
    hint: 'Check the resource before retrying; give the operator the requestId.',
    cause: error,
  });
}

/** The sandbox an answer names (`sandboxId`; E2B's answers spell it `sandboxID`), for the audit outcome. */
function sandboxIdOf(body: unknown): string | undefined {
  const answer = body as { sandboxId?: unknown; sandboxID?: unknown } | null;
  const id = answer?.sandboxId ?? answer?.sandboxID;
  return typeof id === 'string' ? id : undefined;
}

const TURN = Symbol('turn');

/** Resolves once the event loop has run what was ready (I/O callbacks included). */
function nextTurn(): Promise<typeof TURN> {
  return new Promise((resolve) => setImmediate(() => resolve(TURN)));
}

/**
 * The lines of `source` as a byte stream in which every line ready in the same turn of the event
 * loop (a process's last output and its exit) shares one chunk: one write, one packet, one wakeup
 * of the client instead of one per line, up to the stream's high-water mark. `onWait` runs
 * once, the first time the stream has nothing to send.
 */
export function coalesce(source: AsyncIterable<string>, onWait: () => void): Readable {
  const iterator = source[Symbol.asyncIterator]();
  let pending: Promise<IteratorResult<string>> | undefined;
  let waited = false;
  const stream = new Readable({
    read() {
      void (async () => {
        let chunk = '';
        for (;;) {
          const next = pending ?? iterator.next();
          pending = undefined;
          let ready = await Promise.race([next, nextTurn()]);
          if (ready === TURN) {
            if (chunk !== '') {
              pending = next;
              break;
            }
            if (!waited) {
              waited = true;
              onWait();
            }
            ready = await next;
          }
          if (ready.done) {
            if (chunk !== '') stream.push(chunk);
            stream.push(null);
            return;
          }
          chunk += ready.value;
          // A backlog (a reattach to a chatty process) goes out in bounded chunks, and pushing
          // one lets the socket's backpressure and the event loop in.
          if (chunk.length >= stream.readableHighWaterMark) break;
        }
        stream.push(chunk);
      })().catch((error: unknown) => stream.destroy(error as Error));
    },
    destroy(error, callback) {
      void iterator.return?.();
      callback(error);
    },
  });
  return stream;
}

/** NDJSON lines; a failure after the headers went out becomes a last `error` line. */
function ndjson(events: AsyncIterable<object>, settled: Promise<object> | undefined, requestId: string, log: FastifyBaseLogger): AsyncIterable<string> {
  async function* lines(): AsyncGenerator<string> {
    try {
      for await (const event of events) {
        if (settled && (event as { type?: unknown }).type === 'exit') {
          yield `${JSON.stringify(await settled)}\n`;
          return;
        }
        yield `${JSON.stringify(event)}\n`;
      }
    } catch (error) {
      const wire = error instanceof SandboxError ? error : new SandboxError('INTERNAL', 'internal error; the server logged the details under this request id');
      if (!(error instanceof SandboxError)) log.error({ err: error }, 'stream failed');
      yield `${JSON.stringify({ type: 'error', error: { code: wire.code, message: wire.message, requestId } })}\n`;
    }
  }
  return lines();
}

/** Fields holding a path in the sandbox: a bad one is INVALID_PATH. */
const PATH_FIELDS = new Set(['path', 'source', 'destination']);

function parsePart<T>(part: 'params' | 'query' | 'body', schema: z.ZodType<T> | undefined, value: unknown): T {
  if (!schema) return value as T;
  const result = schema.safeParse(value);
  if (result.success) return result.data;
  if (part !== 'params') {
    const field = String(result.error.issues[0]?.path[0] ?? '');
    throw invalidRequest(part, result.error, PATH_FIELDS.has(field) ? 'INVALID_PATH' : 'INVALID_ARGUMENT');
  }
  // An id that cannot exist names nothing: not found, with the code of what was looked up.
  const field = String(result.error.issues[0]?.path[0] ?? '');
  throw invalidRequest(part, result.error, field === 'sandboxId' ? 'SANDBOX_NOT_FOUND' : field === 'pid' ? 'PROCESS_NOT_FOUND' : 'NOT_FOUND');
}

function jsonBody(body: unknown, expected: boolean): unknown {
  if (body instanceof Readable || typeof body === 'string') {
    throw new SandboxError('INVALID_ARGUMENT', 'the body must be JSON', {
      details: { field: 'content-type' },
      hint: 'Send the body with Content-Type: application/json.',
    });
  }
  const isEmptyObject = typeof body === 'object' && body !== null && !Array.isArray(body) && Object.keys(body).length === 0;
  if (!expected && body !== undefined && body !== null && !isEmptyObject) {
    throw new SandboxError('INVALID_ARGUMENT', 'this call takes no body', { details: { field: 'body' } });
  }
  return expected || !isEmptyObject ? body : undefined;
}

/** Bytes of an abandoned upload read and dropped so the client can read the answer. */
const DRAIN_LIMIT_BYTES = 64 * 1024 * 1024;

/**
 * The route reads a copy of the request stream: when it gives up early (a file over its limit)
 * and destroys what it reads, the request itself survives.
 */
function rawBody(body: unknown): Readable {
  if (body instanceof Readable) {
    const copy = new PassThrough();
    // A route that gave up before reading (it refused the call) leaves the copy unread: its error
    // when the upload is then cut off concerns nobody, and must not be an uncaught one.
    copy.on('error', () => undefined);
    body.pipe(copy);
    // pipe() does not pass on a client that went away mid-upload: the reader must see it.
    body.once('error', (error) => copy.destroy(error));
    body.once('close', () => {
      if (!body.readableEnded) copy.destroy(new SandboxError('ABORTED', 'the client stopped sending the body before its end'));
    });
    return copy;
  }
  if (body === undefined || body === null) return Readable.from([]);
  throw new SandboxError('INVALID_ARGUMENT', 'the body must be raw bytes', {
    details: { field: 'content-type' },
    hint: 'Send the bytes with Content-Type: application/octet-stream.',
  });
}

/**
 * An upload the route stopped reading is drained (up to a bound) and the connection closed after
 * the answer: otherwise the client, still sending, sees a reset instead of the error.
 */
function drainUnread(body: unknown, reply: FastifyReply): void {
  if (!(body instanceof Readable) || body.readableEnded || body.destroyed) return;
  if ((body as Readable & { complete?: boolean }).complete === true) return;
  body.unpipe();
  reply.header('connection', 'close');
  let left = DRAIN_LIMIT_BYTES;
  body.on('data', (chunk: Buffer) => {
    left -= chunk.length;
    if (left < 0) body.destroy();
  });
  body.resume();
}

/** Aborts when the client goes before the answer is written, or when the server closes. */
function requestSignal(reply: FastifyReply, closeSignal: AbortSignal): AbortSignal {
  const controller = new AbortController();
  const linked = linkedSignal(controller.signal, closeSignal);
  reply.raw.once('close', () => {
    if (!reply.raw.writableFinished) controller.abort();
    linked.release();
  });
  return linked.signal;
}
