import type { LimitResource } from '../wire/index.js';

/**
 * `capsule run` exits with the sandboxed command's own code (128+N when a signal ended it), or
 * with one of these when Capsule ended the work or could not start it. Documented in the README.
 */
export const LIMIT_EXIT_CODES: Record<LimitResource, number> = {
  wall_clock: 124,
  memory: 201,
  pids: 202,
  disk: 203,
  file_size: 204,
  output: 205,
  cpu: 206,
  egress: 207,
};

export const EXIT_USAGE = 2;
export const EXIT_COMMAND_NOT_FOUND = 127;
export const EXIT_HOST_NOT_READY = 69;
export const EXIT_INTERNAL = 70;
/** Not found: a sandbox, process, file or context (sysexits' EX_NOINPUT). */
export const EXIT_NOT_FOUND = 66;
/** Bad or missing API key, or not allowed (sysexits' EX_NOPERM). */
export const EXIT_PERMISSION = 77;

export function exitCodeForError(code: string): number {
  switch (code) {
    case 'INVALID_ARGUMENT':
    case 'INVALID_SPEC':
    case 'SPEC_EXCEEDS_MAXIMUM':
    case 'BACKEND_CANNOT_ENFORCE':
      return EXIT_USAGE;
    case 'EXEC_FAILED':
      return EXIT_COMMAND_NOT_FOUND;
    case 'HOST_NOT_READY':
    case 'BACKEND_UNAVAILABLE':
    case 'SERVER_UNREACHABLE':
      return EXIT_HOST_NOT_READY;
    case 'UNAUTHENTICATED':
    case 'PERMISSION_DENIED':
      return EXIT_PERMISSION;
    case 'NOT_FOUND':
    case 'SANDBOX_NOT_FOUND':
    case 'PROCESS_NOT_FOUND':
    case 'FILE_NOT_FOUND':
    case 'TEMPLATE_NOT_FOUND':
    case 'SNAPSHOT_NOT_FOUND':
    case 'VOLUME_NOT_FOUND':
      return EXIT_NOT_FOUND;
    default:
      return EXIT_INTERNAL;
  }
}
