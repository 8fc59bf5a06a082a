import type { ErrorCode } from './codes.js';

/** HTTP status per error code. `satisfies` makes a missing or extra code a compile error. */
export const HTTP_STATUS = {
  INVALID_ARGUMENT: 400,
  INVALID_SPEC: 422,
  INVALID_PATH: 400,
  PAYLOAD_TOO_LARGE: 413,
  UNAUTHENTICATED: 401,
  PERMISSION_DENIED: 403,
  NOT_FOUND: 404,
  SANDBOX_NOT_FOUND: 404,
  TEMPLATE_NOT_FOUND: 404,
  SNAPSHOT_NOT_FOUND: 404,
  VOLUME_NOT_FOUND: 404,
  PROCESS_NOT_FOUND: 404,
  FILE_NOT_FOUND: 404,
  ALREADY_EXISTS: 409,
  IS_A_DIRECTORY: 409,
  NOT_A_DIRECTORY: 409,
  CONFLICT: 409,
  IDEMPOTENCY_KEY_REUSED: 409,
  SANDBOX_NOT_RUNNING: 409,
  IMAGE_NOT_FOUND: 404,
  /** The image cannot be a template as it is (ids past 65535, an unreadable config). */
  IMAGE_UNSUPPORTED: 422,
  /** The registry did not answer: a bad host name, a refused connection, TLS. */
  REGISTRY_UNREACHABLE: 502,
  /** The registry refused the operator's credentials (or asked for some and none are stored). */
  REGISTRY_UNAUTHORIZED: 403,
  /** A build step failed: the details name the step, its line, the exit code and the last log lines. */
  BUILD_FAILED: 422,
  QUOTA_EXCEEDED: 429,
  CAPACITY_EXHAUSTED: 503,
  LIMIT_EXCEEDED: 422,
  NO_SPACE: 507,
  FILE_TOO_LARGE: 413,
  SPEC_EXCEEDS_MAXIMUM: 422,
  REPORT_INVALID: 422,
  REPORT_TOO_LARGE: 413,
  BACKEND_UNAVAILABLE: 503,
  BACKEND_CANNOT_ENFORCE: 422,
  HOST_NOT_READY: 503,
  EXEC_FAILED: 422,
  /** The template's start command failed or its ready check never passed. */
  TEMPLATE_NOT_READY: 422,
  SANDBOX_CRASHED: 502,
  /** Nothing accepts connections on the sandbox port a request was relayed to. */
  PORT_NOT_LISTENING: 502,
  /** Client side: the SDK or CLI could not reach the Capsule server. */
  SERVER_UNREACHABLE: 503,
  TIMEOUT: 504,
  ABORTED: 499,
  UNIMPLEMENTED: 501,
  INTERNAL: 500,
} as const satisfies Record<ErrorCode, number>;
