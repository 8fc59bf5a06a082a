import { describe, expect, it } from 'vitest';
import { classifyFailure, fileError } from '../../src/engine/files/errors.js';
import { parseSpec } from '../../src/sandbox-spec/index.js';

const fail = (stderr: string, exitCode: number | null = 1, signal: NodeJS.Signals | null = null) => ({ stderr, exitCode, signal });

describe('classifyFailure', () => {
  it.each([
    ["cat: /workspace/x: No such file or directory", 'FILE_NOT_FOUND'],
    ["find: '/workspace/x': No such file or directory", 'FILE_NOT_FOUND'],
    ["sh: 1: cannot open /x: No such file", 'FILE_NOT_FOUND'],
    ["cat: /workspace/d: Is a directory", 'IS_A_DIRECTORY'],
    ["mv: cannot overwrite directory '/workspace/d' with non-directory", 'IS_A_DIRECTORY'],
    ["find: '/workspace/f/x': Not a directory", 'NOT_A_DIRECTORY'],
    ["mv: cannot overwrite non-directory '/workspace/f' with directory '/workspace/d'", 'NOT_A_DIRECTORY'],
    ["mkdir: cannot create directory '/workspace/d': File exists", 'ALREADY_EXISTS'],
    ["mv: cannot move '/workspace/a' to '/workspace/b': Directory not empty", 'ALREADY_EXISTS'],
    ["mktemp: failed to create file via template '/usr/.capsule-upload-XXXXXXXX': Read-only file system", 'PERMISSION_DENIED'],
    ["cat: /root/x: Permission denied", 'PERMISSION_DENIED'],
    ["head: error writing 'standard output': Disk quota exceeded", 'NO_SPACE'],
    ["head: error writing 'standard output': No space left on device", 'NO_SPACE'],
    ["head: error writing 'standard output': File too large", 'FILE_TOO_LARGE'],
    ["mv: cannot move '/workspace/a' to a subdirectory of itself, '/workspace/a/b'", 'INVALID_PATH'],
    ["cat: /workspace/loop: Too many levels of symbolic links", 'INVALID_PATH'],
    ["sh: 1: Cannot fork", 'LIMIT_EXCEEDED'],
  ])('%s → %s', (stderr, code) => {
    expect(classifyFailure(fail(stderr))).toBe(code);
  });

  it('recognises SIGXFSZ as FILE_TOO_LARGE, as a signal or as the shell status 153', () => {
    expect(classifyFailure(fail('', null, 'SIGXFSZ'))).toBe('FILE_TOO_LARGE');
    expect(classifyFailure(fail('', 153))).toBe('FILE_TOO_LARGE');
    expect(classifyFailure(fail('something odd', 2))).toBeUndefined();
  });
});

describe('fileError', () => {
  const limits = parseSpec({ limits: { diskBytes: 32 * 1024 * 1024, fileSizeBytes: 1024 * 1024 } }).limits;
  const context = { operation: 'write' as const, path: '/workspace/a', sandboxId: 'sb', limits };

  it('names the path, the limit and what to do', () => {
    const noSpace = fileError(fail('Disk quota exceeded'), context);
    expect(noSpace.code).toBe('NO_SPACE');
    expect(noSpace.status).toBe(507);
    expect(noSpace.message).toBe('write: no space left for /workspace/a: the workspace disk limit of 32 MiB is reached');
    expect(noSpace.hint).toMatch(/raise limits\.diskBytes/);
    const tmp = fileError(fail('No space left on device'), { ...context, path: '/tmp/a' });
    expect(tmp.message).toMatch(/\/tmp is full \(limits\.tmpBytes = 64 MiB\)/);
    const tooLarge = fileError(fail('', 153), context);
    expect(tooLarge.message).toBe('write: /workspace/a would be larger than the single-file limit of 1 MiB');
    expect(fileError(fail('No such file or directory'), { ...context, operation: 'read' }).status).toBe(404);
  });

  it('reports an unrecognised failure as INTERNAL with the helper stderr in details', () => {
    const error = fileError(fail('weird: thing happened', 2), context);
    expect(error.code).toBe('INTERNAL');
    expect(error.message).toBe('write: /workspace/a failed in the sandbox (exit status 2: weird: thing happened)');
    expect(error.details).toMatchObject({ path: '/workspace/a', reason: 'weird: thing happened' });
  });
});
