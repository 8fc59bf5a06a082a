import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { createBackends } from '../../src/backends/registry.js';
import { GvisorBackend } from '../../src/backends/gvisor/gvisor-backend.host.js';
import { InterpreterService } from '../../src/engine/interpreter/index.js';
import { parseSpec } from '../../src/sandbox-spec/index.js';
import { SandboxManager } from '../../src/engine/sandbox-manager.js';
import { MemoryRecordStore } from '../../src/store/index.js';
import type { ProcessHandle } from '../../src/engine/types.js';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';

afterEach(expectNoLeaks);

const T = 'tenant-gvisor';

/** A variable only in memory, a thread counting in a file, and "show" on stdin printing both. */
const STATEFUL = [
  'import sys, threading, time, secrets',
  'secret = secrets.token_hex(8)',
  'n = 0',
  'def tick():',
  '    global n',
  '    while True:',
  '        n += 1',
  '        time.sleep(0.02)',
  'threading.Thread(target=tick, daemon=True).start()',
  'print("secret", secret, flush=True)',
  'for line in sys.stdin:',
  '    print("show", secret, n, flush=True)',
].join('\n');

const COUNTER = 'i=0; while :; do i=$((i+1)); echo $i > /workspace/n.tmp; mv /workspace/n.tmp /workspace/n; sleep 0.02; done';

/**
 * Polls every 20 ms until `read` returns more than `than`. The 30 s deadline is reached only by a
 * failure: generous, so a busy machine (2 shared cores) cannot trip it.
 */
async function countAbove(read: () => Promise<number>, than: number): Promise<number> {
  const deadline = Date.now() + 30_000;
  for (;;) {
    const value = await read();
    if (value > than) return value;
    if (Date.now() > deadline) throw new Error(`the counter stayed at ${value} (wanted more than ${than})`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

/** Resolves with the first stdout line starting with `prefix` (events replay from the start). */
async function lineStartingWith(proc: ProcessHandle, prefix: string, after = 0): Promise<{ line: string; index: number }> {
  let text = '';
  for await (const event of proc.events()) {
    if (event.type === 'stdout') text += event.data.toString();
    const found = text.split('\n').map((line, index) => ({ line, index })).filter((l) => l.index >= after && l.line.startsWith(`${prefix} `));
    if (found[0] && text.includes(`${found[0].line}\n`)) return found[0];
    if (event.type === 'exit') break;
  }
  throw new Error(`the process ended before printing "${prefix} ..."`);
}

describe('gVisor sandboxes under the engine (SandboxManager)', () => {
  it('keeps a running process, its memory and its handle across pause/resume, both as freeze and as checkpoint', async () => {
    const manager = await SandboxManager.open({ dataDir: testDataDir(), backends: createBackends(new HostEnvironment({ dataDir: testDataDir() })) });
    try {
      const info = await manager.create({ tenantId: T, spec: { backend: 'gvisor', limits: { wallClockMs: 120_000 } } });
      const proc = await manager.startProcess(T, info.sandboxId, { argv: ['python3', '-c', STATEFUL], stdin: true });
      const secret = (await lineStartingWith(proc, 'secret')).line.split(' ')[1];
      const counter = await manager.startProcess(T, info.sandboxId, { argv: ['sh', '-c', COUNTER] });
      const workspace = new HostEnvironment({ dataDir: testDataDir() }).volume.path(info.sandboxId);
      const count = async (): Promise<number> => Number((await readFile(join(workspace, 'n'), 'utf8').catch(() => '0')).trim() || 0);
      await countAbove(count, 3);

      // The engine's pause keeps memory: on gVisor a checkpoint on disk.
      const paused = await manager.pause(T, info.sandboxId);
      expect(paused.state).toBe('paused');
      expect(paused.pause).toMatchObject({ keepsMemory: true, survivesRestart: true });
      await manager.resume(T, info.sandboxId);
      proc.writeStdin('show\n');
      const first = await lineStartingWith(proc, 'show');
      expect(first.line.split(' ')[1]).toBe(secret);

      // A second round: the manager's process handle keeps working, because the agent client
      // hands its processes to the restored agent.
      expect((await manager.pause(T, info.sandboxId)).pause).toMatchObject({ keepsMemory: true, survivesRestart: true });
      const atPause = await count();
      await manager.resume(T, info.sandboxId);
      // The background counter continues from where it was, not from zero.
      await countAbove(count, atPause + 3);
      proc.writeStdin('show\n');
      const second = await lineStartingWith(proc, 'show', first.index + 1);
      const [, secretAfter, countAfter] = second.line.split(' ');
      expect(secretAfter).toBe(secret);
      expect(Number(countAfter)).toBeGreaterThanOrEqual(Number(first.line.split(' ')[2]));
      proc.closeStdin();
      expect((await proc.result).outcome).toBe('ok');
      counter.signal('SIGKILL');
      expect((await counter.result).signal).toBe('SIGKILL');
    } finally {
      await manager.close();
    }
  });
});

describe('interpreter contexts on gVisor', () => {
  it('keeps a Python context\'s variables across a checkpoint pause and resume', async () => {
    const backend = new GvisorBackend({ host: new HostEnvironment({ dataDir: testDataDir() }) });
    const sandbox = await backend.create(parseSpec({ backend: 'gvisor', limits: { memoryBytes: 1024 * 1024 ** 2, pids: 256, wallClockMs: 60_000 } }), {
      id: 'gv-interp',
    });
    const interpreters = new InterpreterService(sandbox);
    try {
      const { id: contextId } = await interpreters.createContext({ language: 'python' });
      const first = await interpreters.runCode('import secrets\nx = secrets.token_hex(8)\nx', { contextId });
      expect(first.error, JSON.stringify(first)).toBeUndefined();
      const x = first.results.find((r) => r.isMainResult)?.text;
      expect(x).toMatch(/^'[0-9a-f]{16}'$/);

      expect(await sandbox.pause!({ keepMemory: true })).toEqual({ keepsMemory: true, survivesRestart: true });
      await sandbox.resume!();

      const second = await interpreters.runCode('x', { contextId });
      expect(second.error, JSON.stringify(second)).toBeUndefined();
      expect(second.results.find((r) => r.isMainResult)?.text).toBe(x);
      expect(second.executionCount).toBe(2);
    } finally {
      await interpreters.close();
      await sandbox.destroy();
    }
  });
});

describe('pause to disk survives an engine restart (gVisor)', () => {
  it('restores a paused sandbox in a new engine: the in-memory variable and the counter continue', async () => {
    const store = new MemoryRecordStore();
    const dataDir = testDataDir();
    // The first engine is dropped without close(), as a crashed server would be.
    const before = await SandboxManager.open({ dataDir, store, backends: createBackends(new HostEnvironment({ dataDir })) });
    const info = await before.create({ tenantId: T, spec: { backend: 'gvisor', ttlMs: 120_000, limits: { wallClockMs: 120_000 } } });
    const proc = await before.startProcess(T, info.sandboxId, { argv: ['python3', '-c', STATEFUL], stdin: true });
    const secret = (await lineStartingWith(proc, 'secret')).line.split(' ')[1];
    await before.startProcess(T, info.sandboxId, { argv: ['sh', '-c', COUNTER] });
    const workspace = new HostEnvironment({ dataDir }).volume.path(info.sandboxId);
    const count = async (): Promise<number> => Number((await readFile(join(workspace, 'n'), 'utf8').catch(() => '0')).trim() || 0);
    await countAbove(count, 3);
    const paused = await before.pause(T, info.sandboxId);
    expect(paused.pause).toMatchObject({ keepsMemory: true, survivesRestart: true });
    const atPause = await count();

    const after = await SandboxManager.open({ dataDir, store, backends: createBackends(new HostEnvironment({ dataDir })) });
    try {
      expect(after.get(T, info.sandboxId).state).toBe('paused');
      expect((await after.resume(T, info.sandboxId)).state).toBe('running');
      await countAbove(count, atPause + 3);
      const restored = after.getProcess(T, info.sandboxId, proc.pid);
      restored.writeStdin('show\n');
      const shown = await lineStartingWith(restored, 'show');
      expect(shown.line.split(' ')[1]).toBe(secret);
    } finally {
      await after.close();
    }
  });
});
