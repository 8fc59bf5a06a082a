import type { ErrorCode } from './codes.js';
import { HTTP_STATUS } from './status.js';

export interface SandboxErrorOptions {
  /** Machine-readable context: the field, the limit, the path. Never a secret. */
  details?: Record<string, unknown>;
  /** What the caller can do about it. */
  hint?: string;
  cause?: unknown;
}

/** The wire shape of every error Capsule returns. */
export interface ErrorBody {
  code: ErrorCode;
  message: string;
  details?: Record<string, unknown>;
  hint?: string;
  requestId?: string;
}

/** The one root of Capsule's errors: a stable code, a readable message, an HTTP status. */
export class SandboxError extends Error {
  readonly code: ErrorCode;
  readonly details: Record<string, unknown> | undefined;
  readonly hint: string | undefined;

  constructor(code: ErrorCode, message: string, options: SandboxErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = 'SandboxError';
    this.code = code;
    this.details = options.details;
    this.hint = options.hint;
  }

  get status(): number {
    return HTTP_STATUS[this.code];
  }

  toJSON(requestId?: string): ErrorBody {
    const body: ErrorBody = { code: this.code, message: this.message };
    if (this.details !== undefined) body.details = this.details;
    if (this.hint !== undefined) body.hint = this.hint;
    if (requestId !== undefined) body.requestId = requestId;
    return body;
  }
}

export function isSandboxError(error: unknown, code?: ErrorCode): error is SandboxError {
  return error instanceof SandboxError && (code === undefined || error.code === code);
}
