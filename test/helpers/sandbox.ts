import { expect, inject } from 'vitest';
import { Runner, type RunOptions, type RunResult } from '../../src/engine/runner.js';
import { describeLeaks, findLeaks } from './leaks.js';

export function testDataDir(): string {
  return inject('dataDir');
}

/** A runner on the test run's data directory. Each run() is its own fresh sandbox. */
export function testRunner(): Runner {
  return new Runner({ dataDir: testDataDir() });
}

/** Runs argv in a fresh sandbox; a failed expectation prints the sandbox id and the result. */
export async function runIn(runner: Runner, argv: string[], options: RunOptions = {}): Promise<RunResult> {
  return runner.run(argv, options);
}

export function describeResult(result: RunResult): string {
  const { stdout, stderr, ...rest } = result;
  return `sandbox ${result.sandboxId}: ${JSON.stringify({ ...rest, stdout: stdout.slice(0, 2000), stderr: stderr.slice(0, 2000) })}`;
}

/** Fails the test when any cgroup, sandbox process, workspace or mount of ours is left. */
export async function expectNoLeaks(): Promise<void> {
  const leaks = await findLeaks(testDataDir());
  expect(describeLeaks(leaks), 'host resources left behind').toBe('');
}

/** Runs python3 code in a fresh sandbox. */
export function python(runner: Runner, code: string, options: RunOptions = {}): Promise<RunResult> {
  return runner.run(['python3', '-c', code], options);
}
