import { describe, expect, it } from 'vitest';
import { NextRun } from '../../src/host/next-run.js';

/** Runs that end when the test says so; `started(i)` settles once run i has begun. */
function gatedRuns() {
  const runs: string[][] = [];
  const gates: (() => void)[] = [];
  const begun: (() => void)[] = [];
  const starts = [0, 1, 2].map((i) => new Promise<void>((resolve) => (begun[i] = resolve)));
  const next = new NextRun<string>((items) => {
    runs.push([...items]);
    begun[runs.length - 1]!();
    return new Promise<void>((resolve) => gates.push(resolve));
  });
  return { next, runs, started: (i: number) => starts[i]!, open: (i: number) => gates[i]!() };
}

describe('NextRun', () => {
  it('gives callers that arrive while a run goes one next run with all their items', async () => {
    const { next, runs, started, open } = gatedRuns();
    const first = next.join('a');
    await started(0);
    const second = next.join('b');
    const third = next.join('c');
    expect(runs).toEqual([['a']]);
    open(0);
    await first;
    await started(1);
    expect(runs).toEqual([['a'], ['b', 'c']]);
    open(1);
    await Promise.all([second, third]);
    expect(runs).toHaveLength(2);
  });

  it('rejects the callers of a failed run with its error and runs the next one anyway', async () => {
    let calls = 0;
    const next = new NextRun<number>(() => {
      calls++;
      return calls === 1 ? Promise.reject(new Error('first run failed')) : Promise.resolve();
    });
    await expect(next.join(1)).rejects.toThrow('first run failed');
    await expect(next.join(2)).resolves.toBeUndefined();
    expect(calls).toBe(2);
  });
});
