import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
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

/*
 * A process can outlive its sandbox's retention (a paused gVisor sandbox's handed-over one): its
 * log is still open when the sweep removes the sandbox's logs. When it closes, its bytes must go
 * back to the tenant and its file must go, not be held with nothing left to remove them.
 */
describe('ProcessLogs, a log that closes after its sandbox was swept', () => {
  let dir: string;
  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), 'capsule-process-logs-'));
  });
  afterEach(() => {
    rmSync(dir, { recursive: true, force: true });
  });

  it('gives its bytes back and leaves no file or folder', async () => {
    let now = 1_000_000;
    const charged = new Map<string, number>();
    const add = (tenantId: string, bytes: number) => charged.set(tenantId, (charged.get(tenantId) ?? 0) + bytes);
    const budget = {
      reserve: (owner: { tenantId: string }, bytes: number) => void add(owner.tenantId, bytes),
      take: (owner: { tenantId: string }, bytes: number) => (add(owner.tenantId, bytes), true),
      release: (owner: { tenantId: string }, bytes: number) => void add(owner.tenantId, -bytes),
      restore: (owner: { tenantId: string }, bytes: number) => void add(owner.tenantId, bytes),
    };
    const logs = new ProcessLogs({ dataDir: dir, retentionMs: 1_000, now: () => now, budget });
    const owner = { tenantId: 'acme', sandboxId: 'sbx-late' };
    const early = { ...owner, pid: 1 };
    const late = { ...owner, pid: 2 };
    const earlyLog = logs.open(early, logs.reserve(owner, { stdoutBytes: 1024, stderrBytes: 1024 }));
    const lateLog = logs.open(late, logs.reserve(owner, { stdoutBytes: 1024, stderrBytes: 1024 }));
    earlyLog.append('stdout', Buffer.from('early\n'), true);
    lateLog.append('stdout', Buffer.from('before the sweep\n'), true);
    await lateLog.flush();
    logs.closed(early, earlyLog);
    await logs.flushed();

    logs.sandboxEnded(owner.sandboxId);
    now += 1_001;
    expect(await logs.sweep()).toBe(1);
    expect(existsSync(join(dir, 'logs', owner.sandboxId))).toBe(false);
    // Still open: what it writes now makes the folder again, and is charged as it is written.
    lateLog.append('stdout', Buffer.from('after the sweep\n'), true);
    await lateLog.flush();
    expect(charged.get('acme')).toBeGreaterThan(0);

    logs.closed(late, lateLog);
    await logs.flushed();
    expect(charged.get('acme')).toBe(0);
    expect(existsSync(join(dir, 'logs', owner.sandboxId))).toBe(false);
    expect(logs.keepsEnded(owner.sandboxId)).toBe(false);
  });
});
