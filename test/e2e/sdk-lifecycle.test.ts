import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../../src/server/bootstrap.js';
import {
  AbortedError,
  FileNotFoundError,
  Sandbox,
  SandboxNotFoundError,
  SandboxNotRunningError,
  type ConnectionOptions,
  type WatchEvent,
} from '../../src/sdk/index.js';
import { expectNoLeaks } from '../helpers/sandbox.js';
import { startTestServer } from './server-helpers.js';

/** The SDK against a real `capsule serve` (in-process, loopback) on real sandboxes. */
let server: RunningServer;
let conn: ConnectionOptions;

beforeAll(async () => {
  const started = await startTestServer();
  server = started.server;
  conn = { url: started.url, apiKey: started.apiKey };
});
afterAll(async () => {
  await server?.close();
});
afterEach(expectNoLeaks);

/** A fresh sandbox for one test, killed afterwards; a failure names it. */
async function withSandbox(test: (sandbox: Sandbox) => Promise<void>, spec = {}): Promise<void> {
  const sandbox = await Sandbox.create({ ttlMs: 60_000, ...spec }, { ...conn, metadata: { suite: 'sdk-e2e' } });
  try {
    await test(sandbox);
  } catch (error) {
    (error as Error).message = `[sandbox ${sandbox.sandboxId}] ${(error as Error).message}`;
    throw error;
  } finally {
    if (sandbox.info.state === 'running') await sandbox.kill().catch(() => undefined);
  }
}

async function waitFor(check: () => boolean | Promise<boolean>, timeoutMs: number, what: string): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`${what}: not within ${timeoutMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
}

describe('SDK over a real server', () => {
  it('creates, runs with streamed output, writes/reads/lists files, reattaches to a background process, kills', async () => {
    await withSandbox(async (sandbox) => {
      expect(sandbox.sandboxId).toMatch(/^[a-z2-7]{20}$/);
      expect(sandbox.info).toMatchObject({ state: 'running', metadata: { suite: 'sdk-e2e' } });

      let streamed = '';
      const hi = await sandbox.commands.run('echo hi', { onStdout: (data) => (streamed += data) });
      expect(hi).toMatchObject({ outcome: 'ok', exitCode: 0, stdout: 'hi\n' });
      expect(streamed).toBe('hi\n');

      expect(await sandbox.files.write('notes/a.txt', 'héllo\n')).toMatchObject({ path: '/workspace/notes/a.txt', type: 'file', size: 7 });
      expect(await sandbox.files.read('/workspace/notes/a.txt')).toBe('héllo\n');
      expect(Buffer.from(await sandbox.files.read('notes/a.txt', { format: 'bytes' })).toString()).toBe('héllo\n');
      const cat = await sandbox.commands.run(['cat', 'notes/a.txt']);
      expect(cat.stdout).toBe('héllo\n');
      expect((await sandbox.files.list('/workspace', { depth: 2 })).map((e) => e.path)).toContain('/workspace/notes/a.txt');

      const ticker = await sandbox.commands.run(['sh', '-c', 'for i in 1 2 3; do echo tick $i; done; exec sleep 30'], { background: true });
      let replayed = '';
      const again = await sandbox.commands.connect(ticker.pid, { onStdout: (data) => (replayed += data) });
      await waitFor(() => replayed === 'tick 1\ntick 2\ntick 3\n', 10_000, 'replayed output');
      expect((await sandbox.commands.list()).find((p) => p.pid === ticker.pid)?.running).toBe(true);
      await ticker.kill();
      const ended = await again.wait();
      expect(ended.signal).toBe('SIGKILL');

      const killed = await sandbox.kill();
      expect(killed.state).toBe('killed');
    });
  });

  it('feeds stdin, applies cwd and env, and keeps a background process talking over stdin', async () => {
    await withSandbox(async (sandbox) => {
      const cat = await sandbox.commands.run(['cat'], { stdin: 'from stdin' });
      expect(cat.stdout).toBe('from stdin');
      const env = await sandbox.commands.run(['sh', '-c', 'echo $GREETING; pwd'], { env: { GREETING: 'hey' }, cwd: '/tmp' });
      expect(env.stdout).toBe('hey\n/tmp\n');

      let out = '';
      const rev = await sandbox.commands.run(['sh', '-c', 'while read line; do echo "got $line"; done'], {
        background: true,
        stdin: true,
        onStdout: (data) => (out += data),
      });
      await rev.sendStdin('one\n');
      await waitFor(() => out === 'got one\n', 10_000, 'echo of the first line');
      await rev.sendStdin('two\n');
      await rev.closeStdin();
      expect((await rev.wait()).outcome).toBe('ok');
      expect(out).toBe('got one\ngot two\n');
    });
  });

  it('ends a process at timeoutMs (wall clock) and kills it when the AbortSignal fires', async () => {
    await withSandbox(async (sandbox) => {
      const timed = await sandbox.commands.run(['sleep', '30'], { timeoutMs: 300 });
      expect(timed.outcome).toBe('limit_exceeded');
      expect(timed.limit?.resource).toBe('wall_clock');

      const controller = new AbortController();
      let pid = 0;
      const pending = sandbox.commands.run(['sleep', '30'], {
        signal: controller.signal,
        onStart: (started) => {
          pid = started;
          controller.abort();
        },
      });
      await expect(pending).rejects.toBeInstanceOf(AbortedError);
      await waitFor(async () => (await sandbox.commands.list()).find((p) => p.pid === pid)?.running === false, 10_000, 'aborted process ended');
    });
  });

  it('throws typed errors: unknown, foreign and killed sandboxes; missing files', async () => {
    await withSandbox(async (sandbox) => {
      await expect(sandbox.files.read('nope.txt')).rejects.toBeInstanceOf(FileNotFoundError);
      await expect(sandbox.files.read('nope.txt')).rejects.toMatchObject({ code: 'FILE_NOT_FOUND', status: 404 });
      expect(await sandbox.files.exists('nope.txt')).toBe(false);

      await expect(Sandbox.connect('a'.repeat(20), conn)).rejects.toBeInstanceOf(SandboxNotFoundError);

      const minted = await fetch(`${server.url}/v1/keys`, {
        method: 'POST',
        headers: { authorization: `Bearer ${conn.apiKey}`, 'content-type': 'application/json' },
        body: JSON.stringify({ tenantId: 'other-tenant' }),
      });
      const { apiKey: otherKey } = (await minted.json()) as { apiKey: string };
      const foreign = Sandbox.connect(sandbox.sandboxId, { ...conn, apiKey: otherKey });
      await expect(foreign).rejects.toBeInstanceOf(SandboxNotFoundError);
      await expect(foreign).rejects.toMatchObject({ code: 'SANDBOX_NOT_FOUND', status: 404, requestId: expect.stringMatching(/^req_/) as unknown });

      await expect(Sandbox.connect(sandbox.sandboxId, { ...conn, apiKey: `cap_${'0'.repeat(40)}` })).rejects.toMatchObject({ code: 'UNAUTHENTICATED' });

      // A killed sandbox is still known (state killed) but runs nothing.
      await sandbox.kill();
      expect((await Sandbox.connect(sandbox.sandboxId, conn)).info.state).toBe('killed');
      const ended = sandbox.commands.run('true');
      await expect(ended).rejects.toBeInstanceOf(SandboxNotRunningError);
      await expect(ended).rejects.toMatchObject({ code: 'SANDBOX_NOT_RUNNING', status: 409 });
    });
  });

  it('lists by metadata, sets the timeout, keeps alive, and manages files', async () => {
    await withSandbox(async (sandbox) => {
      const page = await Sandbox.list({ ...conn, metadata: { suite: 'sdk-e2e' }, state: 'running' });
      expect(page.sandboxes.map((s) => s.sandboxId)).toEqual([sandbox.sandboxId]);
      expect(page.nextCursor).toBeNull();

      const before = Date.parse(sandbox.info.expiresAt);
      const shorter = await sandbox.setTimeout(20_000);
      expect(Date.parse(shorter.expiresAt)).toBeLessThan(before);
      const renewed = await sandbox.keepAlive();
      expect(Date.parse(renewed.expiresAt)).toBeGreaterThan(Date.parse(shorter.expiresAt));
      expect((await sandbox.getInfo()).expiresAt).toBe(renewed.expiresAt);

      expect(await sandbox.files.makeDir('a/b')).toMatchObject({ path: '/workspace/a/b', type: 'dir' });
      await sandbox.files.write('a/b/f', new Uint8Array([0, 1, 2, 255]));
      expect(await sandbox.files.stat('a/b/f')).toMatchObject({ size: 4, type: 'file' });
      expect(await sandbox.files.move('a/b/f', 'a/g')).toMatchObject({ path: '/workspace/a/g' });
      expect([...(await sandbox.files.read('a/g', { format: 'bytes' }))]).toEqual([0, 1, 2, 255]);
      const stream = await sandbox.files.read('a/g', { format: 'stream' });
      expect((await new Response(stream).arrayBuffer()).byteLength).toBe(4);
      await sandbox.files.remove('a');
      expect(await sandbox.files.exists('a')).toBe(false);
    });
  });

  it('streams a large upload and watches changes', async () => {
    await withSandbox(async (sandbox) => {
      const chunk = new Uint8Array(64 * 1024).fill(97);
      async function* chunks() {
        for (let i = 0; i < 32; i++) yield await Promise.resolve(chunk);
      }
      expect((await sandbox.files.write('big.bin', chunks())).size).toBe(32 * 64 * 1024);

      const events: WatchEvent[] = [];
      // The server may send the reply's headers only with the first event, and its watcher may
      // start a moment after: write until an event arrives, then take the handle.
      const watching = sandbox.files.watch('/workspace', { onEvent: (event) => events.push(event) });
      let n = 0;
      await waitFor(
        async () => {
          await sandbox.files.write(`w${n++}.txt`, 'x');
          return events.some((e) => e.path.startsWith('/workspace/w'));
        },
        10_000,
        'a watch event',
      );
      const watch = await watching;
      watch.stop();
      await watch.done;
    });
  });
});
