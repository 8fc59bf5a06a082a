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

/**
 * Fails the test when any cgroup, sandbox process, workspace, mount or network object of ours is
 * left. Background work (a network pool refilling, a namespace being made) can show a half-made
 * object in one snapshot, so this waits up to 30 s for a clean one; what stays that long is a leak.
 */
export async function expectNoLeaks(): Promise<void> {
  await expectNoLeaksExcept([]);
}

/** expectNoLeaks for a file that keeps processes of its own on purpose (a test registry): their pids. */
export async function expectNoLeaksExcept(pids: readonly number[]): Promise<void> {
  const kept = new Set(pids);
  const current = async () => {
    const leaks = await findLeaks(testDataDir());
    return describeLeaks({ ...leaks, spares: [], processes: leaks.processes.filter((line) => !kept.has(Number(line.split(' ')[0]))) });
  };
  const deadline = Date.now() + 30_000;
  let described = await current();
  while (described !== '' && Date.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, 100));
    described = await current();
  }
  expect(described, 'host resources left behind').toBe('');
}

/** Runs python3 code in a fresh sandbox. */
export function python(runner: Runner, code: string, options: RunOptions = {}): Promise<RunResult> {
  return runner.run(['python3', '-c', code], options);
}
