import { describe, expect, it } from 'vitest';
import { classifyLimit, type ExecObservation } from '../../src/engine/classify.js';
import { parseSpec } from '../../src/sandbox-spec/index.js';

const zero = { oomKills: 0, pidsMaxEvents: 0, memoryPeakBytes: 0, memoryUsageBytes: 0, cpuUsageUsec: 0, cpuThrottledUsec: 0 };
const limits = parseSpec({}).limits;
const base: ExecObservation = {
  limits, timeoutMs: 1000, timedOut: false, durationMs: 10, exitCode: 1, signal: null, before: zero, after: zero, diskUsedBytes: 0,
};

describe('limit classification', () => {
  it('blames the wall clock first: our kill explains the signal', () => {
    expect(classifyLimit({ ...base, timedOut: true, signal: 'SIGKILL', durationMs: 1003 })?.resource).toBe('wall_clock');
  });
  it('reads an OOM kill from the counter, not the exit code', () => {
    const hit = classifyLimit({ ...base, exitCode: null, signal: 'SIGKILL', after: { ...zero, oomKills: 1, memoryPeakBytes: limits.memoryBytes } });
    expect(hit?.resource).toBe('memory');
    expect(hit?.message).toBe('memory limit 512 MiB exceeded (peak 512 MiB); the process was killed by the OOM killer. Raise limits.memoryBytes (--memory) or reduce the input.');
    expect(classifyLimit({ ...base, exitCode: 137 })).toBeUndefined();
  });
  it('knows SIGXFSZ, a full workspace, and refused forks', () => {
    expect(classifyLimit({ ...base, exitCode: null, signal: 'SIGXFSZ' })?.resource).toBe('file_size');
    expect(classifyLimit({ ...base, diskUsedBytes: limits.diskBytes - 4096 })?.resource).toBe('disk');
    expect(classifyLimit({ ...base, exitCode: 0, diskUsedBytes: limits.diskBytes })).toBeUndefined();
    expect(classifyLimit({ ...base, exitCode: 0, after: { ...zero, pidsMaxEvents: 3 } })?.message).toMatch(/^process limit 128 reached \(3 forks refused\)/);
  });
  it('leaves the program its own failure', () => {
    expect(classifyLimit(base)).toBeUndefined();
  });
});
