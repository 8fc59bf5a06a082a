import type { LimitResource } from '../engine/result.js';

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
      return EXIT_HOST_NOT_READY;
    default:
      return EXIT_INTERNAL;
  }
}
