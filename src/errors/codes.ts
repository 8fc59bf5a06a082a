/**
 * The stable error codes of Capsule. A code never changes meaning once shipped; the HTTP status
 * of each lives in `status.ts`, where the compiler checks that the map is complete.
 */
export const ERROR_CODES = [
  // Bad input: the caller can fix the request.
  'INVALID_ARGUMENT',
  'INVALID_SPEC',
  'INVALID_PATH',
  'PAYLOAD_TOO_LARGE',
  // Auth.
  'UNAUTHENTICATED',
  'PERMISSION_DENIED',
  // Missing or conflicting state.
  'NOT_FOUND',
  'SANDBOX_NOT_FOUND',
  'TEMPLATE_NOT_FOUND',
  'SNAPSHOT_NOT_FOUND',
  'VOLUME_NOT_FOUND',
  'PROCESS_NOT_FOUND',
  'FILE_NOT_FOUND',
  'ALREADY_EXISTS',
  'IS_A_DIRECTORY',
  'NOT_A_DIRECTORY',
  'CONFLICT',
  'IDEMPOTENCY_KEY_REUSED',
  'SANDBOX_NOT_RUNNING',
  // Templates and images.
  'IMAGE_NOT_FOUND',
  'IMAGE_UNSUPPORTED',
  'REGISTRY_UNREACHABLE',
  'REGISTRY_UNAUTHORIZED',
  'BUILD_FAILED',
  // Capacity and limits.
  'QUOTA_EXCEEDED',
  /** The host cannot back the request now (the workspace volume is fully promised); retry later. */
  'CAPACITY_EXHAUSTED',
  'LIMIT_EXCEEDED',
  'NO_SPACE',
  'FILE_TOO_LARGE',
  'SPEC_EXCEEDS_MAXIMUM',
  // Results: the sandbox's report did not meet its contract.
  'REPORT_INVALID',
  'REPORT_TOO_LARGE',
  // Backend and host.
  'BACKEND_UNAVAILABLE',
  'BACKEND_CANNOT_ENFORCE',
  'HOST_NOT_READY',
  'EXEC_FAILED',
  'TEMPLATE_NOT_READY',
  'SANDBOX_CRASHED',
  'PORT_NOT_LISTENING',
  'SERVER_UNREACHABLE',
  'TIMEOUT',
  'ABORTED',
  'UNIMPLEMENTED',
  'INTERNAL',
] as const;

export type ErrorCode = (typeof ERROR_CODES)[number];
