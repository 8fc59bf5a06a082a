import { HTTP_STATUS, SandboxError, type ErrorBody, type ErrorCode } from '../errors/index.js';

export interface CapsuleErrorOptions {
  /** HTTP status of the reply; 0 when no reply arrived (network, timeout, abort). */
  status?: number;
  hint?: string;
  requestId?: string;
  details?: Record<string, unknown>;
  cause?: unknown;
}

/**
 * The root of every error the SDK throws. The server's wire `code` is kept as is, so
 * `error.code === 'FILE_NOT_FOUND'` works as well as `error instanceof FileNotFoundError`.
 * It extends the package-wide `SandboxError`, so `isSandboxError()` recognises it too.
 */
export class CapsuleError extends SandboxError {
  /** The server's request id; quote it when reporting a problem. */
  readonly requestId: string | undefined;
  private readonly httpStatus: number;

  constructor(code: ErrorCode, message: string, options: CapsuleErrorOptions = {}) {
    super(code, message, { details: options.details, hint: options.hint, cause: options.cause });
    this.name = new.target.name;
    this.requestId = options.requestId;
    this.httpStatus = options.status ?? 0;
  }

  /** HTTP status of the reply, or 0 when no reply arrived. */
  override get status(): number {
    return this.httpStatus;
  }

  override toJSON(): ErrorBody {
    return super.toJSON(this.requestId);
  }
}

export class InvalidArgumentError extends CapsuleError {}
/** The spec is invalid, exceeds the operator's maxima, or asks for what the backend cannot enforce. */
export class InvalidSpecError extends InvalidArgumentError {}
export class AuthenticationError extends CapsuleError {}
export class PermissionDeniedError extends CapsuleError {}
export class NotFoundError extends CapsuleError {}
/** The sandbox does not exist, has ended and was forgotten, or belongs to another tenant. */
export class SandboxNotFoundError extends NotFoundError {}
export class ProcessNotFoundError extends NotFoundError {}
export class FileNotFoundError extends NotFoundError {}
/** The template a spec named does not exist (or belongs to another tenant). */
export class TemplateNotFoundError extends NotFoundError {}
/** A template build failed: `details` names the step, its line and the exit code. */
export class BuildFailedError extends CapsuleError {}
export class ConflictError extends CapsuleError {}
export class AlreadyExistsError extends ConflictError {}
/** The sandbox exists but is not running (killed, expired, paused). */
export class SandboxNotRunningError extends ConflictError {}
export class QuotaExceededError extends CapsuleError {}
/** A resource limit was hit: disk full, file too large, a limit of the request. */
export class LimitExceededError extends CapsuleError {}
/** The sandbox's structured report was invalid or too large. */
export class ReportError extends CapsuleError {}
export class UnavailableError extends CapsuleError {}
/** The Capsule server did not answer: not running, wrong URL, or the connection broke. */
export class ConnectionError extends UnavailableError {}
export class ExecFailedError extends CapsuleError {}
/** A template's start command failed, or its ready check never passed. */
export class TemplateNotReadyError extends CapsuleError {}
export class SandboxCrashedError extends CapsuleError {}
/** Nothing accepts connections on the sandbox port a request was relayed to. */
export class PortNotListeningError extends CapsuleError {}
/** The request (or the server's work on it) ran past its deadline. */
export class TimeoutError extends CapsuleError {}
/** The caller's AbortSignal ended the request. */
export class AbortedError extends CapsuleError {}
export class UnimplementedError extends CapsuleError {}
export class InternalError extends CapsuleError {}

type ErrorClass = new (code: ErrorCode, message: string, options?: CapsuleErrorOptions) => CapsuleError;

/** The one map from a wire code to its class; `satisfies` makes a missing code a compile error. */
export const ERROR_CLASSES = {
  INVALID_ARGUMENT: InvalidArgumentError,
  INVALID_SPEC: InvalidSpecError,
  INVALID_PATH: InvalidArgumentError,
  PAYLOAD_TOO_LARGE: InvalidArgumentError,
  UNAUTHENTICATED: AuthenticationError,
  PERMISSION_DENIED: PermissionDeniedError,
  NOT_FOUND: NotFoundError,
  SANDBOX_NOT_FOUND: SandboxNotFoundError,
  TEMPLATE_NOT_FOUND: TemplateNotFoundError,
  SNAPSHOT_NOT_FOUND: NotFoundError,
  VOLUME_NOT_FOUND: NotFoundError,
  PROCESS_NOT_FOUND: ProcessNotFoundError,
  FILE_NOT_FOUND: FileNotFoundError,
  ALREADY_EXISTS: AlreadyExistsError,
  IS_A_DIRECTORY: ConflictError,
  NOT_A_DIRECTORY: ConflictError,
  CONFLICT: ConflictError,
  IDEMPOTENCY_KEY_REUSED: ConflictError,
  SANDBOX_NOT_RUNNING: SandboxNotRunningError,
  IMAGE_NOT_FOUND: NotFoundError,
  IMAGE_UNSUPPORTED: InvalidArgumentError,
  REGISTRY_UNREACHABLE: UnavailableError,
  REGISTRY_UNAUTHORIZED: PermissionDeniedError,
  BUILD_FAILED: BuildFailedError,
  QUOTA_EXCEEDED: QuotaExceededError,
  CAPACITY_EXHAUSTED: UnavailableError,
  LIMIT_EXCEEDED: LimitExceededError,
  NO_SPACE: LimitExceededError,
  FILE_TOO_LARGE: LimitExceededError,
  SPEC_EXCEEDS_MAXIMUM: InvalidSpecError,
  REPORT_INVALID: ReportError,
  REPORT_TOO_LARGE: ReportError,
  BACKEND_UNAVAILABLE: UnavailableError,
  BACKEND_CANNOT_ENFORCE: InvalidSpecError,
  HOST_NOT_READY: UnavailableError,
  EXEC_FAILED: ExecFailedError,
  TEMPLATE_NOT_READY: TemplateNotReadyError,
  SANDBOX_CRASHED: SandboxCrashedError,
  PORT_NOT_LISTENING: PortNotListeningError,
  SERVER_UNREACHABLE: ConnectionError,
  TIMEOUT: TimeoutError,
  ABORTED: AbortedError,
  UNIMPLEMENTED: UnimplementedError,
  INTERNAL: InternalError,
} as const satisfies Record<ErrorCode, ErrorClass>;

/** The code to assume when a reply carries no readable error body (a proxy's HTML page, say). */
function codeForStatus(status: number): ErrorCode {
  if (status === 401) return 'UNAUTHENTICATED';
  if (status === 403) return 'PERMISSION_DENIED';
  if (status === 404) return 'NOT_FOUND';
  if (status === 409) return 'CONFLICT';
  if (status === 413) return 'PAYLOAD_TOO_LARGE';
  if (status === 429) return 'QUOTA_EXCEEDED';
  if (status === 501) return 'UNIMPLEMENTED';
  if (status === 502 || status === 503) return 'BACKEND_UNAVAILABLE';
  if (status === 504) return 'TIMEOUT';
  if (status >= 400 && status < 500) return 'INVALID_ARGUMENT';
  return 'INTERNAL';
}

/**
 * Builds the typed error for a reply. `body` is the parsed JSON (or undefined); a code this SDK
 * does not know (a newer server) becomes a plain `CapsuleError` that keeps the code.
 */
export function errorFromResponse(status: number, body: unknown, requestIdHeader?: string | null): CapsuleError {
  const wire = isErrorBody(body) ? body : undefined;
  const code = wire?.code ?? codeForStatus(status);
  const message = wire?.message ?? `the Capsule server answered HTTP ${status} without an error body`;
  const ErrorClassForCode: ErrorClass = Object.hasOwn(ERROR_CLASSES, code) ? ERROR_CLASSES[code] : CapsuleError;
  return new ErrorClassForCode(code, message, {
    status,
    hint: wire?.hint,
    details: wire?.details,
    requestId: wire?.requestId ?? requestIdHeader ?? undefined,
  });
}

function isErrorBody(body: unknown): body is ErrorBody {
  if (typeof body !== 'object' || body === null) return false;
  const { code, message } = body as Record<string, unknown>;
  return typeof code === 'string' && typeof message === 'string';
}

/** The typed error for an `{"type":"error"}` line of a stream (no HTTP status of its own). */
export function errorFromStreamEvent(error: unknown): CapsuleError {
  const code = isErrorBody(error) ? error.code : 'INTERNAL';
  const status = Object.hasOwn(HTTP_STATUS, code) ? HTTP_STATUS[code] : 500;
  return errorFromResponse(status, error);
}
