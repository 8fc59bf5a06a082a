import { describe, expect, it } from 'vitest';
import { resolveSandboxPath } from '../../src/engine/files/paths.js';
import { isSandboxError } from '../../src/errors/index.js';

function code(input: string): string | undefined {
  try {
    resolveSandboxPath(input);
    return undefined;
  } catch (error) {
    return isSandboxError(error) ? error.code : 'not a SandboxError';
  }
}

describe('resolveSandboxPath', () => {
  it('resolves relative paths and ~ against /workspace', () => {
    expect(resolveSandboxPath('a/b.txt')).toBe('/workspace/a/b.txt');
    expect(resolveSandboxPath('.')).toBe('/workspace');
    expect(resolveSandboxPath('~')).toBe('/workspace');
    expect(resolveSandboxPath('~/x')).toBe('/workspace/x');
    expect(resolveSandboxPath('~user')).toBe('/workspace/~user');
  });

  it('cleans lexically and never climbs above /', () => {
    expect(resolveSandboxPath('../../etc/passwd')).toBe('/etc/passwd');
    expect(resolveSandboxPath('/../../../../x')).toBe('/x');
    expect(resolveSandboxPath('/workspace//a/./b/../c/')).toBe('/workspace/a/c');
    expect(resolveSandboxPath('/')).toBe('/');
    expect(resolveSandboxPath('-rf')).toBe('/workspace/-rf'); // never an option to a helper
  });

  it('rejects empty paths, NUL bytes and overlong paths with INVALID_PATH', () => {
    expect(code('')).toBe('INVALID_PATH');
    expect(code('a\0b')).toBe('INVALID_PATH');
    expect(code(`/${'a'.repeat(5000)}`)).toBe('INVALID_PATH');
    expect(code('/ok')).toBeUndefined();
  });
});
