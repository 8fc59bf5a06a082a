import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { GvisorBackend } from '../../src/backends/gvisor/gvisor-backend.host.js';
import type { BackendSandbox } from '../../src/backends/backend.js';
import type { AgentProcess } from '../../src/backends/agent/index.js';
import { baseEnv } from '../../src/host/sandbox-layout.js';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { parseSpec } from '../../src/sandbox-spec/index.js';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';

afterEach(expectNoLeaks);

/**
 * A Python process with state only in memory (a random secret and a counter), a thread that
 * writes both to /workspace/tick, and a command loop on stdin ("show" prints them).
 */
const STATEFUL = `
import os, sys, threading, time, secrets
secret = secrets.token_hex(8)
ballast = bytearray(os.urandom(8 * 1024 * 1024))
n = 0
def tick():
    global n
    while True:
        n += 1
        with open("/workspace/tick.tmp", "w") as f:
            f.write(f"{secret} {n}")
        os.replace("/workspace/tick.tmp", "/workspace/tick")
        time.sleep(0.02)
threading.Thread(target=tick, daemon=True).start()
print("secret", secret, flush=True)
for line in sys.stdin:
    if line.strip() == "show":
        print("show", secret, n, len(ballast), flush=True)
`;

function newBackend(): GvisorBackend {
  return new GvisorBackend({ host: new HostEnvironment({ dataDir: testDataDir() }) });
}

/** Polls `check` every 20 ms until it returns a value, for at most `timeoutMs`. */
// A deadline only a failure reaches: generous, so a busy machine (2 cores shared) cannot trip it.
async function waitFor<T>(what: string, check: () => Promise<T | undefined>, timeoutMs = 30_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

function lines(proc: AgentProcess): { next(prefix: string): Promise<string> } {
  let text = '';
  const waiters: (() => void)[] = [];
  proc.onStdout((chunk) => {
    text += chunk.toString();
    for (const wake of waiters.splice(0)) wake();
  });
  return {
    async next(prefix) {
      for (;;) {
        const line = text.split('\n').find((l) => l.startsWith(`${prefix} `));
        if (line !== undefined) {
          text = text.replace(`${line}\n`, '');
          return line;
        }
        await new Promise<void>((resolve) => waiters.push(resolve));
      }
    },
  };
}

async function readTick(sandbox: BackendSandbox): Promise<{ secret: string; n: number } | undefined> {
  const text = await readFile(join(sandbox.workspaceDir, 'tick'), 'utf8').catch(() => '');
  const [secret, n] = text.split(' ');
  return secret && n ? { secret, n: Number(n) } : undefined;
}

async function startStateful(sandbox: BackendSandbox): Promise<{ proc: AgentProcess; out: ReturnType<typeof lines>; secret: string }> {
  const proc = await sandbox.exec({ argv: ['python3', '-c', STATEFUL], env: baseEnv(), cwd: '/workspace', stdin: true });
  const out = lines(proc);
  const secret = (await out.next('secret')).split(' ')[1] ?? '';
  await waitFor('the first tick', () => readTick(sandbox));
  return { proc, out, secret };
}

describe('gVisor pause with memory (runsc checkpoint/restore)', () => {
  it('keeps a process, its memory and its stdio across pause and resume', async () => {
    const backend = newBackend();
    const sandbox = await backend.create(parseSpec({ backend: 'gvisor', limits: { memoryBytes: 256 * 1024 ** 2 } }), { id: 'gv-pause-1' });
    try {
      const { proc, out, secret } = await startStateful(sandbox);
      const result = await sandbox.pause!({ keepMemory: true });
      expect(result).toEqual({ keepsMemory: true, survivesRestart: true });
      // Checkpointed: no runsc process holds the memory any more.
      expect(await sandbox.memoryUsageBytes()).toBeLessThan(4 * 1024 ** 2);
      const before = await readTick(sandbox);
      await expect(sandbox.exec({ argv: ['true'], env: baseEnv(), cwd: '/workspace' })).rejects.toMatchObject({ code: 'SANDBOX_NOT_RUNNING' });

      await sandbox.resume!();
      // The same process handle: stdin and stdout were handed over to the restored agent.
      proc.write('show\n');
      const shown = (await out.next('show')).split(' ');
      expect(shown[1]).toBe(secret);
      expect(Number(shown[2])).toBeGreaterThanOrEqual(before?.n ?? 0);
      expect(shown[3]).toBe(String(8 * 1024 * 1024));
      // The counting thread continues from where it was, not from zero.
      const after = await waitFor('the counter to move on', async () => {
        const tick = await readTick(sandbox);
        return tick && tick.n > (before?.n ?? 0) + 2 ? tick : undefined;
      });
      expect(after.secret).toBe(secret);
      // New processes start as before.
      const echo = await sandbox.exec({ argv: ['echo', 'hi'], env: baseEnv(), cwd: '/workspace' });
      expect((await echo.exited).exitCode).toBe(0);
      proc.closeStdin();
      expect((await proc.exited).exitCode).toBe(0);
    } finally {
      await sandbox.destroy();
    }
  });

  it('restores a paused sandbox in a new backend instance (a server restart)', async () => {
    const spec = parseSpec({ backend: 'gvisor' });
    const first = await newBackend().create(spec, { id: 'gv-pause-2' });
    let restored: BackendSandbox | undefined;
    try {
      const { secret, proc } = await startStateful(first);
      await first.pause!({ keepMemory: true });
      const before = await readTick(first);

      // The first backend and its sandbox object are dropped; only the data directory remains.
      const second = newBackend();
      const again = await second.restore('gv-pause-2', spec);
      restored = again;
      await again.resume!();
      const after = await waitFor('the counter to move on', async () => {
        const tick = await readTick(again);
        return tick && tick.n > (before?.n ?? 0) + 2 ? tick : undefined;
      });
      expect(after.secret).toBe(secret);
      // The new process reattaches to the Python process the old one started: same pid, stdin and
      // stdout work through a new handle.
      const [python] = again.processes!();
      expect(python?.pid).toBe(proc.pid);
      const out = lines(python!);
      python!.write('show\n');
      expect((await out.next('show')).split(' ')[1]).toBe(secret);
      const echo = await again.exec({ argv: ['cat', '/workspace/tick'], env: baseEnv(), cwd: '/workspace' });
      expect((await echo.exited).exitCode).toBe(0);
      python!.closeStdin();
      expect((await python!.exited).exitCode).toBe(0);
    } finally {
      await (restored ?? first).destroy();
    }
  });

  it('pauses without memory: processes end, files stay, resume starts a fresh agent', async () => {
    const sandbox = await newBackend().create(parseSpec({ backend: 'gvisor' }), { id: 'gv-pause-3' });
    try {
      const { proc } = await startStateful(sandbox);
      const result = await sandbox.pause!({ keepMemory: false });
      expect(result).toEqual({ keepsMemory: false, survivesRestart: true });
      const exit = await proc.exited;
      expect(exit.signal === 'SIGKILL' || exit.lost, JSON.stringify(exit)).toBe(true);
      await sandbox.resume!();
      const cat = await sandbox.exec({ argv: ['sh', '-c', 'cat /workspace/tick >/dev/null && echo kept'], env: baseEnv(), cwd: '/workspace' });
      let text = '';
      cat.onStdout((c) => (text += c.toString()));
      expect((await cat.exited).exitCode).toBe(0);
      expect(text).toBe('kept\n');
    } finally {
      await sandbox.destroy();
    }
  });
});
