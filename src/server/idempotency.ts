import type { IncomingHttpHeaders } from 'node:http';
import { ERROR_CODES, SandboxError, type ErrorBody } from '../errors/index.js';
import { canonicalJson, sha256Hex, type OperationStore, type StoredResponse } from '../store/index.js';
import type { Principal } from './auth.js';
import { toSandboxError } from './errors.js';

const KEY_PATTERN = /^[\x21-\x7e]{1,200}$/;

/** A claimed Idempotency-Key: the call's response is stored under it when the call ends. */
export interface Idempotency {
  complete(response: StoredResponse): void;
  /** Stores a final error, or forgets the key when a retry may succeed (429, 5xx, aborted). */
  fail(error: unknown, requestId: string): void;
  release(): void;
}

export type BeginIdempotent =
  | { kind: 'started'; idempotency: Idempotency }
  | Replay
  | undefined;

/** The first call's stored response, for a call that repeats its Idempotency-Key. */
export interface Replay {
  kind: 'replay';
  stored: StoredResponse;
  /** The stored failure, rethrown so each API surface answers it in its own error shape. */
  error?: SandboxError;
}

/** A stored response that is one of Capsule's errors, as the error. */
function storedError(stored: StoredResponse): SandboxError | undefined {
  const body = stored.body as Partial<ErrorBody> | null;
  if (stored.status < 400 || !body || typeof body.code !== 'string' || !(ERROR_CODES as readonly string[]).includes(body.code)) return undefined;
  return new SandboxError(body.code, body.message ?? '', {
    ...(body.details ? { details: body.details } : {}),
    ...(body.hint ? { hint: body.hint } : {}),
  });
}

/** Statuses a retry may turn into a success: the key is forgotten, not stored. */
function isRetryable(status: number): boolean {
  return status === 429 || status === 499 || status >= 500;
}

/**
 * Claims the request's Idempotency-Key, or returns the stored response of the first request
 * with it. No header: undefined (the call simply runs).
 */
export function beginIdempotent(
  operations: OperationStore,
  request: { method: string; url: string; headers: IncomingHttpHeaders },
  principal: Principal,
  body: unknown,
  isRawBody: boolean,
): BeginIdempotent {
  const header = request.headers['idempotency-key'];
  if (header === undefined) return undefined;
  const key = Array.isArray(header) ? '' : header;
  if (!KEY_PATTERN.test(key)) {
    throw new SandboxError('INVALID_ARGUMENT', 'Idempotency-Key must be 1-200 printable ASCII characters without spaces', {
      details: { field: 'Idempotency-Key' },
      hint: 'Use a UUID per logical request.',
    });
  }
  // A streamed body cannot be hashed before the call runs: its fingerprint is its declared length.
  const bodyDigest = isRawBody ? `raw:${request.headers['content-length'] ?? 'chunked'}` : sha256Hex(canonicalJson(body ?? null));
  const fingerprint = `${request.method} ${request.url} ${bodyDigest}`;
  const begun = operations.begin(principal.tenantId, key, fingerprint);
  if (begun.kind === 'replay') {
    return { kind: 'replay', stored: begun.response, error: storedError(begun.response) };
  }
  return {
    kind: 'started',
    idempotency: {
      // Each acts only on a key still in progress (the store's statements say so): the first
      // to commit settles it, and one rolled back with its transaction leaves it for the next.
      complete: (response) => operations.complete(principal.tenantId, key, response),
      fail: (error, requestId) => {
        const wire = toSandboxError(error);
        // The outcome of a call whose audit outcome could not be written is unknown: keep the error.
        const isUnknownOutcome = wire.details?.effect === 'unknown';
        if (isRetryable(wire.status) && !isUnknownOutcome) operations.release(principal.tenantId, key);
        else operations.complete(principal.tenantId, key, { status: wire.status, body: wire.toJSON(requestId), contentType: 'application/json' });
      },
      release: () => operations.release(principal.tenantId, key),
    },
  };
}
