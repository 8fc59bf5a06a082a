import { describe, expect, it } from 'vitest';
import { parseSpec, parseBytes, parseDurationMs, formatBytes, loosenings } from '../../src/sandbox-spec/index.js';
import { isSandboxError } from '../../src/errors/index.js';

function codeOf(fn: () => unknown): string | undefined {
  try {
    fn();
  } catch (error) {
    return isSandboxError(error) ? error.code : 'not a SandboxError';
  }
  return undefined;
}

describe('the sandbox spec', () => {
  it('is safe by default', () => {
    const spec = parseSpec({});
    expect(spec.network).toMatchObject({ mode: 'none', allow: [], handles: [] });
    expect(spec.env).toEqual({});
    expect(spec.mounts).toEqual([]);
    expect(spec.limits).toMatchObject({
      cpus: 1, wallClockMs: 30_000, memoryBytes: 512 * 2 ** 20, memoryWarnRatio: 0.8, pids: 128,
      diskBytes: 512 * 2 ** 20, fileSizeBytes: 64 * 2 ** 20, stdoutBytes: 2 ** 20, stderrBytes: 2 ** 20,
    });
    expect(spec.ttlMs).toBe(300_000);
  });

  it('rejects unknown keys, naming the field', () => {
    try {
      parseSpec({ limits: { memory: 5 } });
      expect.unreachable();
    } catch (error) {
      expect(isSandboxError(error, 'INVALID_SPEC')).toBe(true);
      expect((error as Error).message).toMatch(/^invalid sandbox spec: limits: .*memory/);
    }
  });

  it('rejects wrong types and writable host mounts', () => {
    expect(codeOf(() => parseSpec({ limits: { memoryBytes: '1g' } }))).toBe('INVALID_SPEC');
    expect(codeOf(() => parseSpec({ mounts: [{ root: 'data', sandboxPath: '/input', readOnly: false }] }))).toBe('INVALID_SPEC');
    expect(codeOf(() => parseSpec({ env: { 'BAD-NAME': 'x' } }))).toBe('INVALID_SPEC');
    expect(codeOf(() => parseSpec({ cwd: 'relative' }))).toBe('INVALID_SPEC');
  });

  it('refuses limits above the operator maxima with SPEC_EXCEEDS_MAXIMUM', () => {
    expect(codeOf(() => parseSpec({ limits: { cpus: 64 } }))).toBe('SPEC_EXCEEDS_MAXIMUM');
    expect(codeOf(() => parseSpec({ limits: { memoryBytes: 64 * 2 ** 30 } }))).toBe('SPEC_EXCEEDS_MAXIMUM');
  });
});

describe('host mounts in the spec', () => {
  it('name a granted root and a subpath, never a host path', () => {
    const spec = parseSpec({ mounts: [{ root: 'datasets', subpath: 'imagenet/train', sandboxPath: '/data' }] });
    expect(spec.mounts).toEqual([{ root: 'datasets', subpath: 'imagenet/train', sandboxPath: '/data', readOnly: true }]);
    // The old wire shape is an unknown key now: a client cannot name a host path at all.
    expect(codeOf(() => parseSpec({ mounts: [{ hostPath: '/var/lib/capsule', sandboxPath: '/x' }] }))).toBe('INVALID_SPEC');
    expect(codeOf(() => parseSpec({ mounts: [{ root: 'datasets', hostPath: '/', sandboxPath: '/x' }] }))).toBe('INVALID_SPEC');
    expect(codeOf(() => parseSpec({ mounts: [{ root: '/srv/datasets', sandboxPath: '/x' }] }))).toBe('INVALID_SPEC');
    expect(codeOf(() => parseSpec({ mounts: [{ root: 'datasets', subpath: 'a\0b', sandboxPath: '/x' }] }))).toBe('INVALID_SPEC');
  });

  it('refuses sandbox paths that are not normal or that cover the sandbox\'s own', () => {
    for (const sandboxPath of ['/', '/proc', '/proc/1', '/dev/shm', '/sys', '/.capsule', '/a/../../etc', '/a//b', '/a/', '/./a', 'rel']) {
      expect(codeOf(() => parseSpec({ mounts: [{ root: 'data', sandboxPath }] })), sandboxPath).toBe('INVALID_SPEC');
    }
    expect(codeOf(() => parseSpec({ mounts: [{ root: 'a', sandboxPath: '/in' }, { root: 'b', sandboxPath: '/in' }] }))).toBe('INVALID_SPEC');
    expect(parseSpec({ mounts: [{ root: 'data', sandboxPath: '/input/deep' }] }).mounts[0]?.sandboxPath).toBe('/input/deep');
  });
});

describe('loosenings', () => {
  it('are nothing for the default spec, or for limits lowered', () => {
    expect(loosenings(parseSpec({}))).toBeUndefined();
    expect(loosenings(parseSpec({ limits: { memoryBytes: 64 * 2 ** 20, cpus: 0.5 }, ttlMs: 1000 }))).toBeUndefined();
  });

  it('name every raised limit, a longer TTL, the network, handles and mounts', () => {
    const spec = parseSpec({
      limits: { memoryBytes: 2 ** 30, shmBytes: 128 * 2 ** 20, cpus: 0.5 },
      ttlMs: 3_600_000,
      network: { mode: 'allowlist', allow: ['pypi.org'], handles: ['github'], maxConnections: 10_000 },
      mounts: [{ root: 'datasets', subpath: 'a', sandboxPath: '/data' }, { root: 'models', sandboxPath: '/models' }],
    });
    expect(loosenings(spec)).toEqual({
      limits: { memoryBytes: 2 ** 30, shmBytes: 128 * 2 ** 20 },
      ttlMs: 3_600_000,
      network: { mode: 'allowlist', allow: ['pypi.org'], maxConnections: 10_000 },
      handles: ['github'],
      mounts: [
        { root: 'datasets', subpath: 'a', sandboxPath: '/data', readOnly: true },
        { root: 'models', subpath: '', sandboxPath: '/models', readOnly: true },
      ],
    });
  });

  it('record root as the default user and raised concurrent connections', () => {
    expect(loosenings(parseSpec({ template: 'base', user: 'root' }))).toEqual({ user: 'root' });
    expect(loosenings(parseSpec({ template: 'base', user: 'user' }))).toBeUndefined();
    expect(loosenings(parseSpec({ network: { mode: 'allowlist', maxConcurrentConnections: 512 } }))).toEqual({
      network: { mode: 'allowlist', allow: [], maxConcurrentConnections: 512 },
    });
  });

  it('record an internet grant even with no allow entries', () => {
    expect(loosenings(parseSpec({ network: { mode: 'internet' } }))).toEqual({ network: { mode: 'internet', allow: [] } });
  });
});

describe('units', () => {
  it('reads sizes and durations', () => {
    expect(parseBytes('256MiB')).toBe(256 * 2 ** 20);
    expect(parseBytes('1g')).toBe(1e9);
    expect(parseBytes('512')).toBe(512);
    expect(parseDurationMs('10s')).toBe(10_000);
    expect(parseDurationMs('250ms')).toBe(250);
    expect(parseDurationMs('2m')).toBe(120_000);
    expect(formatBytes(128 * 2 ** 20)).toBe('128 MiB');
  });

  it('names the field of a bad value', () => {
    expect(() => parseBytes('lots', '--memory')).toThrow(/--memory: cannot read "lots" as a size/);
    expect(() => parseDurationMs('soon', '--timeout')).toThrow(/--timeout/);
  });
});
