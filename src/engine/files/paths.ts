import { posix } from 'node:path';
import { SandboxError } from '../../errors/index.js';

/** Where relative paths (and `~`) resolve inside the sandbox. */
export const WORKSPACE = '/workspace';
/** Longest path accepted (Linux PATH_MAX). */
const MAX_PATH_BYTES = 4096;

/**
 * Turns a caller's path into the absolute path the sandbox is asked about. Purely lexical, like
 * Go's filepath.Clean: `..` cannot climb above `/`, and symlinks are left for the sandbox's own
 * kernel to resolve, so no host path is ever looked at here.
 */
export function resolveSandboxPath(input: string, field = 'path'): string {
  if (typeof input !== 'string' || input.length === 0) {
    throw invalidPath(input, field, 'the path is empty', 'Pass a file path: absolute, or relative to /workspace.');
  }
  if (input.includes('\0')) {
    throw invalidPath(input, field, 'the path contains a NUL byte', 'Remove the NUL byte: Linux paths cannot contain one.');
  }
  if (Buffer.byteLength(input) > MAX_PATH_BYTES) {
    throw invalidPath(input, field, `the path is longer than ${MAX_PATH_BYTES} bytes`, 'Use a shorter path.');
  }
  let path = input;
  if (path === '~') path = WORKSPACE;
  else if (path.startsWith('~/')) path = `${WORKSPACE}/${path.slice(2)}`;
  else if (!path.startsWith('/')) path = `${WORKSPACE}/${path}`;
  const normalized = posix.normalize(path);
  return normalized.length > 1 && normalized.endsWith('/') ? normalized.slice(0, -1) : normalized;
}

/** The last component of an absolute path; `/` for the root. */
export function baseName(path: string): string {
  return path === '/' ? '/' : posix.basename(path);
}

function invalidPath(input: unknown, field: string, why: string, hint: string): SandboxError {
  const shown = typeof input === 'string' ? JSON.stringify(input.slice(0, 200)) : String(input);
  return new SandboxError('INVALID_PATH', `${field} ${shown} is not a valid sandbox path: ${why}`, {
    details: { field },
    hint,
  });
}
