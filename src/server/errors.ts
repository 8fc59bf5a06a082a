import type { FastifyBaseLogger, FastifyError, FastifyReply, FastifyRequest } from 'fastify';
import type { z } from 'zod';
import { SandboxError, isSandboxError, type ErrorBody, type ErrorCode } from '../errors/index.js';

/** A zod failure on one part of a request, as a 400 naming the field. */
export function invalidRequest(part: 'body' | 'query' | 'params', error: z.ZodError, code: ErrorCode = 'INVALID_ARGUMENT'): SandboxError {
  const issues = error.issues.map((issue) => {
    const path = issue.path.map(String).join('.');
    const keys = 'keys' in issue && Array.isArray(issue.keys) ? ` (${issue.keys.join(', ')})` : '';
    return { field: path === '' ? part : `${part}.${path}`, message: `${issue.message}${keys}` };
  });
  const first = issues[0] ?? { field: part, message: 'invalid' };
  return new SandboxError(code, `${first.field}: ${first.message}`, {
    details: { field: first.field, issues },
    hint: part === 'body' ? 'Fix the named field; unknown fields are rejected. See GET /openapi.json.' : 'Fix the named parameter. See GET /openapi.json.',
  });
}

/**
 * Turns anything thrown while serving a request into the wire error. Capsule's own errors keep
 * their code; Fastify's request errors (bad JSON, too large, bad content type) become the
 * matching 4xx; anything else is a generic 500 whose details go to the log only.
 */
export function toSandboxError(error: unknown): SandboxError {
  if (isSandboxError(error)) return error;
  const fastifyError = error as Partial<FastifyError>;
  const status = typeof fastifyError.statusCode === 'number' ? fastifyError.statusCode : 500;
  const code = typeof fastifyError.code === 'string' ? fastifyError.code : '';
  if (code === 'FST_ERR_CTP_BODY_TOO_LARGE' || status === 413) {
    return new SandboxError('PAYLOAD_TOO_LARGE', 'the request body is larger than the 1 MiB a JSON body may be', {
      details: { field: 'body', limitBytes: 1024 * 1024 },
      hint: 'Send file contents with PUT /v1/sandboxes/{id}/files (streamed, no such limit).',
    });
  }
  if (code === 'FST_ERR_CTP_INVALID_MEDIA_TYPE' || status === 415) {
    return new SandboxError('INVALID_ARGUMENT', 'this content type is not accepted here', {
      details: { field: 'content-type' },
      hint: 'Send JSON bodies as application/json and raw bytes as application/octet-stream.',
    });
  }
  if (isDiskFull(error)) {
    // The server's own disk (database, logs, spools), not a sandbox's quota: nothing new can be
    // recorded, so nothing new is made; what runs goes on.
    return new SandboxError('CAPACITY_EXHAUSTED', 'the server\'s data disk is full: nothing new can be recorded, so this was refused (running sandboxes go on)', {
      details: { resource: 'data_disk' },
      hint: 'Retry later; the operator frees space on the filesystem of the data directory (capsule serve --data-dir).',
    });
  }
  if (code.startsWith('FST_ERR_CTP_') || error instanceof SyntaxError || (status >= 400 && status < 500)) {
    return new SandboxError('INVALID_ARGUMENT', `the request is malformed: ${fastifyError.message ?? 'unreadable'}`, {
      details: { field: code.startsWith('FST_ERR_CTP_') || error instanceof SyntaxError ? 'body' : 'request' },
      hint: 'Send a JSON object with Content-Type: application/json. See GET /openapi.json.',
    });
  }
  return new SandboxError('INTERNAL', 'internal error; the server logged the details under this request id', {
    hint: 'Retry later; if it persists, give the operator the requestId.',
  });
}

/** SQLite's "database or disk is full" and the kernel's ENOSPC/EDQUOT, also as the cause of another error. */
function isDiskFull(error: unknown): boolean {
  for (let cause = error, depth = 0; cause !== null && typeof cause === 'object' && depth < 4; cause = (cause as { cause?: unknown }).cause, depth += 1) {
    const code = (cause as { code?: unknown }).code;
    if (code === 'SQLITE_FULL' || code === 'ENOSPC' || code === 'EDQUOT') return true;
  }
  return false;
}

/** Sends `error` as `{ code, message, details?, hint?, requestId }` with its status (and Retry-After when it has one). */
export function sendError(request: FastifyRequest, reply: FastifyReply, error: unknown): FastifyReply {
  const { status, headers, body } = errorAnswer(request.log, request.id, error);
  return reply.code(status).headers(headers).type('application/json').send(body);
}

/** What a call that failed with `error` answers (status, headers, wire body), logged by its class. */
export function errorAnswer(log: FastifyBaseLogger, requestId: string, error: unknown): { status: number; headers: Record<string, string>; body: ErrorBody } {
  const wire = toSandboxError(error);
  if (wire.code === 'CAPACITY_EXHAUSTED') log.warn({ code: wire.code, details: wire.details }, 'request refused: no capacity');
  else if (wire.status >= 500) log.error({ err: error, code: wire.code }, 'request failed');
  else log.info({ code: wire.code }, 'request rejected');
  const retryAfter = retryAfterSeconds(wire);
  return { status: wire.status, headers: retryAfter === undefined ? {} : { 'retry-after': String(retryAfter) }, body: wire.toJSON(requestId) };
}

const DEFAULT_RETRY_AFTER_S = 30;

/**
 * Seconds a client should wait before it retries, for an error that is about the moment rather
 * than the request: its `details.retryAfterS` (CAPACITY_EXHAUSTED, a tenant at its quota of
 * sandboxes), else 30 for CAPACITY_EXHAUSTED and nothing for the others.
 */
export function retryAfterSeconds(error: SandboxError): number | undefined {
  const seconds = error.details?.retryAfterS;
  if (typeof seconds === 'number' && seconds > 0) return Math.ceil(seconds);
  return error.code === 'CAPACITY_EXHAUSTED' ? DEFAULT_RETRY_AFTER_S : undefined;
}
