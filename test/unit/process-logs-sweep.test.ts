import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { ProcessLogs } from '../../src/engine/process-logs.js';

/*
 * The sweep removes the logs of sandboxes whose retention ended. A removal that fails (here the
 * logs folder is a file, so every path under it is ENOTDIR) must not abort the sweep for the
 * others nor drop the sandbox from the schedule: its logs are still on disk and charged.
 */
describe('ProcessLogs.sweep', () => {
  let dir: string;
  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), 'capsule-process-logs-'));
  });
  afterEach(() => {
    vi.restoreAllMocks();
    rmSync(dir, { recursive: true, force: true });
  });

  it('keeps a sandbox whose logs could not be removed for a later sweep, reports it, and sweeps the rest', async () => {
    let now = 1_000_000;
    const logs = new ProcessLogs({ dataDir: dir, retentionMs: 1_000, now: () => now });
    const removed: string[] = [];
    logs.onRemoved = (sandboxId) => removed.push(sandboxId);
    const stderr = vi.spyOn(process.stderr, 'write').mockImplementation(() => true);

    writeFileSync(join(dir, 'logs'), 'not a folder');
    logs.sandboxEnded('sbx-a');
    logs.sandboxEnded('sbx-b');
    now += 1_001;
    expect(await logs.sweep()).toBe(0);
    expect(removed).toEqual([]);
    expect(logs.keepsEnded('sbx-a')).toBe(true);
    expect(logs.keepsEnded('sbx-b')).toBe(true);
    expect(logs.failures).toBe(2);
    expect(String(stderr.mock.calls[0]?.[0])).toMatch(/output log of sandbox sbx-a failed/);

    // Repaired: not before the retry delay, then both go.
    rmSync(join(dir, 'logs'));
    mkdirSync(join(dir, 'logs'));
    expect(await logs.sweep()).toBe(0);
    now += 60_000;
    expect(await logs.sweep()).toBe(2);
    expect(removed).toEqual(['sbx-a', 'sbx-b']);
    expect(logs.keepsEnded('sbx-a')).toBe(false);
  });
});
