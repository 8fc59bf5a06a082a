import { afterEach, describe, expect, it } from 'vitest';
import { Runner } from '../../src/engine/runner.js';
import { describeResult, expectNoLeaks, testDataDir } from '../helpers/sandbox.js';

const MiB = 1024 * 1024;
afterEach(expectNoLeaks);

async function waitFor(check: () => boolean, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`condition not met within ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

describe('warm pool (sandboxes started ahead, each used once)', () => {
  it('serves runs from warm sandboxes, re-limited for each spec, never reused; close() awaits deferred teardowns', async () => {
    const runner = new Runner({ dataDir: testDataDir(), warmPool: 2, deferTeardown: true });
    try {
      const pool = (runner as unknown as { pool: { size: number } }).pool;
      await waitFor(() => pool.size === 2, 15_000);
      const first = await runner.run(['sh', '-c', 'touch /workspace/mark; ls /workspace']);
      expect(first.outcome, describeResult(first)).toBe('ok');
      await waitFor(() => pool.size === 2, 15_000);
      // A fresh sandbox every time: the previous run's file is not there.
      const second = await runner.run(['ls', '/workspace']);
      expect(second.stdout, describeResult(second)).toBe('');
      expect(second.sandboxId).not.toBe(first.sandboxId);
      // A warm sandbox adopts the run's own limits.
      await waitFor(() => pool.size === 2, 15_000);
      const hog = await runner.run(['python3', '-c', 'x = bytearray(100 * 1024 * 1024)'], { spec: { limits: { memoryBytes: 48 * MiB } } });
      expect(hog.limit?.resource, describeResult(hog)).toBe('memory');
      expect(hog.limit?.limit).toBe(48 * MiB);
    } finally {
      await runner.close();
    }
  });

  it('starts cold when the spec cannot come from the pool', async () => {
    const runner = new Runner({ dataDir: testDataDir(), warmPool: 1 });
    try {
      const r = await runner.run(['sh', '-c', 'echo $((1 + 1))'], { spec: { limits: { tmpBytes: 8 * MiB } } });
      expect(r.stdout, describeResult(r)).toBe('2\n');
    } finally {
      await runner.close();
    }
  });
});
