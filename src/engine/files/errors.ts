import { SandboxError, type ErrorCode } from '../../errors/index.js';
import { formatBytes, type SandboxSpec } from '../../sandbox-spec/index.js';

export type FileOperation = 'read' | 'write' | 'list' | 'stat' | 'mkdir' | 'move' | 'remove' | 'watch';

/** How an in-sandbox helper (cat, mv, find, ...) ended. */
export interface HelperFailure {
  exitCode: number | null;
  signal: NodeJS.Signals | null;
  stderr: string;
}

export interface FileErrorContext {
  operation: FileOperation;
  /** The path the error is about, as the sandbox sees it. */
  path: string;
  sandboxId: string;
  limits: SandboxSpec['limits'];
}

/** A shell reports a process killed by signal n as exit status 128 + n; SIGXFSZ is 25. */
const SIGXFSZ_STATUS = 128 + 25;

/**
 * strerror(3) texts in the C locale (helpers run with LC_ALL=C), plus the few coreutils phrases
 * that carry no errno. The first match wins, so the most specific texts come first.
 */
const STDERR_CODES: readonly (readonly [RegExp, ErrorCode])[] = [
  [/File too large/, 'FILE_TOO_LARGE'],
  [/Disk quota exceeded|No space left on device/, 'NO_SPACE'],
  [/Is a directory|cannot overwrite directory .* with non-directory/, 'IS_A_DIRECTORY'],
  [/Not a directory|cannot overwrite non-directory/, 'NOT_A_DIRECTORY'],
  [/No such file or directory|No such file/, 'FILE_NOT_FOUND'],
  [/File exists|Directory not empty/, 'ALREADY_EXISTS'],
  [/Permission denied|Read-only file system|Operation not permitted|Device or resource busy/, 'PERMISSION_DENIED'],
  [/Cannot fork|Resource temporarily unavailable/, 'LIMIT_EXCEEDED'],
  [/File name too long|Too many levels of symbolic links|subdirectory of itself|Invalid argument/, 'INVALID_PATH'],
];

/** The stable code for a helper's failure, or undefined when nothing in it is recognised. */
export function classifyFailure(failure: HelperFailure): ErrorCode | undefined {
  if (failure.signal === 'SIGXFSZ' || failure.exitCode === SIGXFSZ_STATUS) return 'FILE_TOO_LARGE';
  for (const [pattern, code] of STDERR_CODES) if (pattern.test(failure.stderr)) return code;
  return undefined;
}

/** A SandboxError that names the path and says what to do; INTERNAL when the failure is unknown. */
export function fileError(failure: HelperFailure, context: FileErrorContext): SandboxError {
  const code = classifyFailure(failure) ?? 'INTERNAL';
  return fileErrorFor(code, context, failure);
}

export function fileErrorFor(code: ErrorCode, context: FileErrorContext, failure?: HelperFailure): SandboxError {
  const { operation, path, limits } = context;
  const details: Record<string, unknown> = { path, operation, sandboxId: context.sandboxId };
  const reason = failure?.stderr.trim().slice(-500);
  if (reason) details.reason = reason;
  const make = (message: string, hint: string): SandboxError => new SandboxError(code, message, { details, hint });
  switch (code) {
    case 'FILE_NOT_FOUND':
      return make(
        `${operation}: ${path} does not exist in the sandbox`,
        'Check the path (relative paths resolve against /workspace); list the parent directory to see what is there.',
      );
    case 'IS_A_DIRECTORY':
      return make(
        `${operation}: ${path} is a directory`,
        operation === 'read' || operation === 'write'
          ? 'Pass a file path; use list to see what a directory holds.'
          : 'Pass a path that is not an existing directory, or remove the directory first.',
      );
    case 'NOT_A_DIRECTORY':
      return make(
        `${operation}: ${path} is not a directory, or a component of it is a file`,
        operation === 'list' ? 'list takes a directory path; use stat for a file.' : 'Check each component of the path; a file cannot hold entries.',
      );
    case 'ALREADY_EXISTS':
      return make(`${operation}: ${path} already exists`, 'Choose another path, or remove the existing one first.');
    case 'PERMISSION_DENIED':
      return make(
        `${operation}: the sandbox may not ${operation === 'read' || operation === 'list' || operation === 'stat' || operation === 'watch' ? 'access' : 'change'} ${path}`,
        'Only /workspace and /tmp are writable in a sandbox; the rest of its file system is read-only.',
      );
    case 'NO_SPACE': {
      const inTmp = path === '/tmp' || path.startsWith('/tmp/');
      return make(
        inTmp
          ? `${operation}: no space left for ${path}: /tmp is full (limits.tmpBytes = ${formatBytes(limits.tmpBytes)})`
          : `${operation}: no space left for ${path}: the workspace disk limit of ${formatBytes(limits.diskBytes)} is reached`,
        inTmp ? 'Remove files from /tmp or raise limits.tmpBytes.' : 'Remove files from /workspace or raise limits.diskBytes.',
      );
    }
    case 'FILE_TOO_LARGE':
      return make(
        `${operation}: ${path} would be larger than the single-file limit of ${formatBytes(limits.fileSizeBytes)}`,
        'Write a smaller file or raise limits.fileSizeBytes.',
      );
    case 'LIMIT_EXCEEDED':
      return make(
        `${operation}: ${path}: the sandbox ran out of processes (limits.pids = ${limits.pids}) while the file helper ran`,
        'End some processes in the sandbox, or create it with a higher limits.pids.',
      );
    case 'INVALID_PATH':
      return make(`${operation}: ${path} cannot be used: ${reason ?? 'the sandbox rejected the path'}`, 'Use a shorter path without symlink loops.');
    default:
      return make(
        `${operation}: ${path} failed in the sandbox (${describeEnd(failure)})`,
        'Retry; if it keeps failing, check that the sandbox is running and not out of processes (limits.pids).',
      );
  }
}

function describeEnd(failure: HelperFailure | undefined): string {
  if (failure === undefined) return 'unknown failure';
  const how = failure.signal !== null ? `killed by ${failure.signal}` : `exit status ${String(failure.exitCode)}`;
  const reason = failure.stderr.trim().split('\n').pop();
  return reason ? `${how}: ${reason}` : how;
}
