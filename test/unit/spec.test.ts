import { describe, expect, it } from 'vitest';
import { parseSpec, parseBytes, parseDurationMs, formatBytes } from '../../src/spec/index.js';
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
    expect(codeOf(() => parseSpec({ mounts: [{ hostPath: '/data', sandboxPath: '/input', readOnly: false }] }))).toBe('INVALID_SPEC');
    expect(codeOf(() => parseSpec({ env: { 'BAD-NAME': 'x' } }))).toBe('INVALID_SPEC');
    expect(codeOf(() => parseSpec({ cwd: 'relative' }))).toBe('INVALID_SPEC');
  });

  it('refuses limits above the operator maxima with SPEC_EXCEEDS_MAXIMUM', () => {
    expect(codeOf(() => parseSpec({ limits: { cpus: 64 } }))).toBe('SPEC_EXCEEDS_MAXIMUM');
    expect(codeOf(() => parseSpec({ limits: { memoryBytes: 64 * 2 ** 30 } }))).toBe('SPEC_EXCEEDS_MAXIMUM');
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
