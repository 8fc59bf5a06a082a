import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { isSandboxError, type ErrorCode } from '../../errors/index.js';

/**
 * The Connect protocol (connectrpc.com/docs/protocol) with the JSON codec, as the E2B SDK speaks
 * it to envd over HTTP/1.1: unary calls are JSON POSTs, server streams are envelopes (one flag
 * byte, a big-endian u32 length, JSON) ending with an end-stream envelope (flag 0x02).
 */
export type ConnectCode =
  | 'canceled'
  | 'unknown'
  | 'invalid_argument'
  | 'deadline_exceeded'
  | 'not_found'
  | 'already_exists'
  | 'permission_denied'
  | 'resource_exhausted'
  | 'failed_precondition'
  | 'aborted'
  | 'unimplemented'
  | 'internal'
  | 'unavailable'
  | 'unauthenticated';

const HTTP_STATUS: Record<ConnectCode, number> = {
  canceled: 499,
  unknown: 500,
  invalid_argument: 400,
  deadline_exceeded: 504,
  not_found: 404,
  already_exists: 409,
  permission_denied: 403,
  resource_exhausted: 429,
  failed_precondition: 400,
  aborted: 409,
  unimplemented: 501,
  internal: 500,
  unavailable: 503,
  unauthenticated: 401,
};

/** An error the handler means to send as this Connect code. */
export class ConnectError extends Error {
  constructor(
    readonly code: ConnectCode,
    message: string,
  ) {
    super(message);
  }
}

const FROM_CAPSULE: Partial<Record<ErrorCode, ConnectCode>> = {
  INVALID_ARGUMENT: 'invalid_argument',
  INVALID_PATH: 'invalid_argument',
  INVALID_SPEC: 'invalid_argument',
  PAYLOAD_TOO_LARGE: 'resource_exhausted',
  UNAUTHENTICATED: 'unauthenticated',
  PERMISSION_DENIED: 'permission_denied',
  NOT_FOUND: 'not_found',
  SANDBOX_NOT_FOUND: 'not_found',
  PROCESS_NOT_FOUND: 'not_found',
  FILE_NOT_FOUND: 'not_found',
  ALREADY_EXISTS: 'already_exists',
  IS_A_DIRECTORY: 'invalid_argument',
  NOT_A_DIRECTORY: 'invalid_argument',
  CONFLICT: 'aborted',
  SANDBOX_NOT_RUNNING: 'unavailable',
  LIMIT_EXCEEDED: 'resource_exhausted',
  QUOTA_EXCEEDED: 'resource_exhausted',
  CAPACITY_EXHAUSTED: 'unavailable',
  NO_SPACE: 'resource_exhausted',
  FILE_TOO_LARGE: 'resource_exhausted',
  EXEC_FAILED: 'invalid_argument',
  TIMEOUT: 'deadline_exceeded',
  ABORTED: 'canceled',
  UNIMPLEMENTED: 'unimplemented',
};

/** Any thrown value as a Connect error body; unexpected faults keep their message out of the wire. */
export function toConnectError(error: unknown): { code: ConnectCode; message: string } {
  if (error instanceof ConnectError) return { code: error.code, message: error.message };
  if (isSandboxError(error)) {
    const hint = error.hint ? ` ${error.hint}` : '';
    return { code: FROM_CAPSULE[error.code] ?? 'internal', message: `${error.message}.${hint}`.replace(/\.\./g, '.') };
  }
  return { code: 'internal', message: 'internal error in the Capsule E2B facade; the server log has the details' };
}

/**
 * The HTTP status and message of a failed envd REST or code-interpreter call: a Connect error's
 * status, a Capsule error's own (`statusFor` may remap a code), a Fastify 4xx, or an opaque 500.
 */
export function plainError(error: unknown, statusFor: (code: ErrorCode, status: number) => number = (_code, status) => status): { status: number; message: string } {
  if (error instanceof ConnectError) return { status: connectStatus(error.code), message: error.message };
  if (isSandboxError(error)) return { status: statusFor(error.code, error.status), message: [error.message, error.hint].filter(Boolean).join('. ') };
  const statusCode = (error as { statusCode?: unknown }).statusCode;
  if (typeof statusCode === 'number' && statusCode < 500) return { status: statusCode, message: (error as Error).message };
  return { status: 500, message: 'internal error in the Capsule E2B facade; the server log has the details' };
}

export function connectStatus(code: ConnectCode): number {
  return HTTP_STATUS[code];
}

const MAX_REQUEST_ENVELOPE_BYTES = 4 * 1024 * 1024;

/**
 * Server-streaming calls send their one request message as an envelope
 * (`application/connect+json`): it is decoded as the body is parsed, so the seam validates,
 * fingerprints and audits it like any JSON body.
 */
export function parseConnectEnvelopes(app: FastifyInstance): void {
  app.addContentTypeParser('application/connect+json', { parseAs: 'buffer', bodyLimit: MAX_REQUEST_ENVELOPE_BYTES + 5 }, (_request, body, done) => {
    const all = body as Buffer;
    if (all.length < 5) return done(new ConnectError('invalid_argument', 'the request envelope is truncated'), undefined);
    const length = all.readUInt32BE(1);
    if (all.length < 5 + length) return done(new ConnectError('invalid_argument', 'the request envelope is shorter than its length'), undefined);
    try {
      const message: unknown = JSON.parse(all.subarray(5, 5 + length).toString('utf8'));
      if (message && typeof message === 'object' && !Array.isArray(message)) return done(null, message);
    } catch {
      // Reported below.
    }
    return done(new ConnectError('invalid_argument', 'the request message is not a JSON object'), undefined);
  });
}

/** Whether a call is a server stream (its error goes in an end-stream envelope, with status 200). */
function isStreamingCall(request: FastifyRequest): boolean {
  return String(request.headers['content-type'] ?? '').startsWith('application/connect+json');
}

/**
 * An envd call's error as Connect sends it: a unary call gets `{code, message}` with its HTTP
 * status; a server stream gets status 200 and an end-stream envelope carrying the error.
 */
export function sendConnectError(request: FastifyRequest, reply: FastifyReply, error: unknown): FastifyReply {
  const wire = toConnectError(error);
  if (wire.code === 'internal') request.log.error({ err: error }, 'envd call failed');
  if (isStreamingCall(request)) return reply.code(200).type('application/connect+json').send(envelope(2, { error: wire }));
  return reply.code(connectStatus(wire.code)).type('application/json').send(wire);
}

function envelope(flags: number, message: object): Buffer {
  const json = Buffer.from(JSON.stringify(message));
  const head = Buffer.alloc(5);
  head.writeUInt8(flags, 0);
  head.writeUInt32BE(json.length, 1);
  return Buffer.concat([head, json]);
}

/** `Connect-Timeout-Ms`, when the client sent one. */
export function deadlineMs(request: FastifyRequest): number | undefined {
  const raw = request.headers['connect-timeout-ms'];
  const value = typeof raw === 'string' ? Number(raw) : NaN;
  return Number.isInteger(value) && value > 0 ? value : undefined;
}

export interface StreamOptions {
  /** The message sent after this long without one (`Keepalive-Ping-Interval`, seconds). */
  keepalive: object;
  /** Aborted when the client goes away; the producer should stop. */
  controller: AbortController;
}

/**
 * Streams `messages` as Connect envelopes, with keepalive messages while idle, and ends with the
 * end-stream envelope (carrying the error, if the producer threw). The reply is hijacked: the
 * headers go out at once so the client sees the stream start.
 */
export async function serverStream(
  request: FastifyRequest,
  reply: FastifyReply,
  options: StreamOptions,
  messages: (signal: AbortSignal) => AsyncIterable<object>,
): Promise<void> {
  const { controller } = options;
  const raw = reply.raw;
  reply.hijack();
  raw.once('close', () => {
    if (!raw.writableFinished) controller.abort();
  });
  raw.writeHead(200, { 'content-type': 'application/connect+json', 'x-request-id': request.id });
  raw.flushHeaders();
  const intervalS = Number(request.headers['keepalive-ping-interval']);
  let keepalive: NodeJS.Timeout | undefined;
  const arm = (): void => {
    if (!(intervalS > 0)) return;
    clearTimeout(keepalive);
    keepalive = setTimeout(() => {
      if (!raw.writableEnded) raw.write(envelope(0, options.keepalive));
      arm();
    }, intervalS * 1000);
  };
  let end: object = {};
  try {
    arm();
    for await (const message of messages(controller.signal)) {
      if (raw.writableEnded || controller.signal.aborted) break;
      // A slow client holds the producer (a replay read from disk) back instead of the heap.
      if (!raw.write(envelope(0, message))) await drained(raw, controller.signal);
      arm();
    }
  } catch (error) {
    const wire = toConnectError(error);
    if (wire.code === 'internal') request.log.error({ err: error }, 'envd stream failed');
    end = { error: wire };
  } finally {
    clearTimeout(keepalive);
    if (!raw.writableEnded) raw.end(envelope(2, end));
  }
}

/** Resolves when `stream` can take more, closes, or `signal` aborts. */
function drained(stream: NodeJS.WritableStream, signal: AbortSignal): Promise<void> {
  if (signal.aborted) return Promise.resolve();
  return new Promise((resolve) => {
    const done = (): void => {
      stream.off('drain', done);
      stream.off('close', done);
      signal.removeEventListener('abort', done);
      resolve();
    };
    stream.on('drain', done);
    stream.on('close', done);
    signal.addEventListener('abort', done, { once: true });
  });
}
