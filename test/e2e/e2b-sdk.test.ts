import { randomBytes } from 'node:crypto';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { AuthenticationError, CommandExitError, FileNotFoundError, Sandbox, SandboxNotFoundError, type FilesystemEvent } from 'e2b';
import { expectNoLeaks } from '../helpers/sandbox.js';
import { startE2bServer, type E2bTestServer } from './e2b-harness.js';
import { waitFor } from './server-helpers.js';

/** The official `e2b` SDK (2.51.0, pinned) against `capsule serve` over loopback. */
let server: E2bTestServer;

beforeAll(async () => {
  server = await startE2bServer();
});
afterAll(async () => {
  await server?.server.close();
});
afterEach(expectNoLeaks);

/** A fresh sandbox for one test, killed afterwards; a failure names it. */
async function withSandbox(test: (sandbox: Sandbox) => Promise<void>, options: { metadata?: Record<string, string> } = {}): Promise<void> {
  const sandbox = await Sandbox.create({ ...server.opts, timeoutMs: 60_000, ...options });
  try {
    await test(sandbox);
  } catch (error) {
    (error as Error).message = `[sandbox ${sandbox.sandboxId}] ${(error as Error).message}`;
    throw error;
  } finally {
    await sandbox.kill().catch(() => undefined);
  }
}

describe('e2b SDK 2.51 against Capsule', () => {
  it('runs commands: stdout, stderr, exit codes, env, cwd /home/user as user', () =>
    withSandbox(async (sbx) => {
      const ok = await sbx.commands.run('echo hi; echo err >&2; pwd; whoami; echo $FOO', { envs: { FOO: 'bar' } });
      expect(ok).toMatchObject({ exitCode: 0, stdout: 'hi\n/home/user\nuser\nbar\n', stderr: 'err\n' });
      const failure = await sbx.commands.run('echo partial; exit 3').catch((error: unknown) => error);
      expect(failure).toBeInstanceOf(CommandExitError);
      expect(failure).toMatchObject({ exitCode: 3, stdout: 'partial\n', error: 'exit status 3' });
      const root = await sbx.commands.run('id', { user: 'root' }).catch((error: unknown) => error);
      expect(String(root)).toMatch(/the host template has one user, "user"/);
    }));

  it('runs background commands: list, stdin, connect, kill', () =>
    withSandbox(async (sbx) => {
      const cat = await sbx.commands.run('cat', { background: true, stdin: true });
      await sbx.commands.sendStdin(cat.pid, 'line one\n');
      await sbx.commands.closeStdin(cat.pid);
      const catResult = await cat.wait();
      expect(catResult).toMatchObject({ exitCode: 0, stdout: 'line one\n' });

      const sleeper = await sbx.commands.run('sleep 600', { background: true });
      expect((await sbx.commands.list()).map((p) => p.pid)).toContain(sleeper.pid);
      const attached = await sbx.commands.connect(sleeper.pid);
      expect(await sbx.commands.kill(sleeper.pid)).toBe(true);
      const killed = await attached.wait().catch((error: unknown) => error);
      expect(killed).toBeInstanceOf(CommandExitError);
      expect(killed).toMatchObject({ exitCode: -1 });
      expect(await sbx.commands.kill(sleeper.pid)).toBe(false);
      expect((await sbx.commands.list()).map((p) => p.pid)).not.toContain(sleeper.pid);
    }));

  it('ends a command at its timeoutMs', () =>
    withSandbox(async (sbx) => {
      // `sleep 30` ending by itself raises nothing: the error is the proof that the timeout ended it.
      const error = await sbx.commands.run('sleep 30', { timeoutMs: 1000 }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(Error);
      await waitFor(async () => ((await sbx.commands.list()).length === 0 ? true : undefined), { what: 'the timed-out command to end' });
    }));

  it('reads, writes, lists, stats, moves and removes files under /home/user', () =>
    withSandbox(async (sbx) => {
      const info = await sbx.files.write('dir/a.txt', 'hello');
      expect(info).toMatchObject({ path: '/home/user/dir/a.txt', name: 'a.txt', type: 'file' });
      expect(await sbx.files.read('/home/user/dir/a.txt')).toBe('hello');
      expect(await sbx.files.exists('dir/a.txt')).toBe(true);
      expect(await sbx.files.exists('dir/nope.txt')).toBe(false);
      expect(await sbx.files.makeDir('made/deep')).toBe(true);
      expect(await sbx.files.makeDir('made/deep')).toBe(false);
      const listed = await sbx.files.list('/home/user/dir');
      expect(listed).toEqual([
        expect.objectContaining({ name: 'a.txt', path: '/home/user/dir/a.txt', type: 'file', size: 5, mode: 0o644, permissions: '-rw-r--r--', owner: 'user' }),
      ]);
      const dir = await sbx.files.getInfo('made');
      expect(dir).toMatchObject({ type: 'dir', path: '/home/user/made', permissions: 'drwxr-xr-x' });
      const moved = await sbx.files.rename('dir/a.txt', 'made/b.txt');
      expect(moved).toMatchObject({ path: '/home/user/made/b.txt', name: 'b.txt' });
      await sbx.files.remove('made');
      expect(await sbx.files.exists('made')).toBe(false);
      await expect(sbx.files.read('made/b.txt')).rejects.toBeInstanceOf(FileNotFoundError);
      // Several files in one multipart request; the empty one reads back empty.
      const many = await sbx.files.write([
        { path: 'm/one.txt', data: '1' },
        { path: '/home/user/m/empty.txt', data: '' },
      ]);
      expect(many.map((f) => f.path)).toEqual(['/home/user/m/one.txt', '/home/user/m/empty.txt']);
      expect(await sbx.files.read('m/empty.txt')).toBe('');
      expect((await sbx.commands.run('cat m/one.txt')).stdout).toBe('1');
    }));

  it('uploads 10 MiB (multipart and gzip octet-stream) byte for byte', () =>
    withSandbox(async (sbx) => {
      const data = randomBytes(10 * 1024 * 1024);
      await sbx.files.write('big.bin', new Blob([data]));
      const back = await sbx.files.read('big.bin', { format: 'bytes' });
      expect(Buffer.from(back).equals(data)).toBe(true);
      await sbx.files.write('big.gz.bin', data.buffer.slice(data.byteOffset, data.byteOffset + data.length), { gzip: true });
      const sums = await sbx.commands.run('sha256sum big.bin big.gz.bin | cut -d" " -f1 | uniq | wc -l');
      expect(sums.stdout.trim()).toBe('1');
    }));

  it('serves signed upload and download URLs (no routing headers, no token)', () =>
    withSandbox(async (sbx) => {
      const upload = await sbx.uploadUrl('signed/up.txt', { useSignatureExpiration: 60_000 });
      expect(upload.startsWith(`${server.url}/files?`)).toBe(true);
      const form = new FormData();
      form.append('file', new Blob(['signed bytes']), 'up.txt');
      const posted = await fetch(upload, { method: 'POST', body: form });
      expect(posted.status).toBe(200);
      expect(await posted.json()).toEqual([{ path: '/home/user/signed/up.txt', name: 'up.txt', type: 'file' }]);
      const download = await sbx.downloadUrl('signed/up.txt');
      expect(await (await fetch(download)).text()).toBe('signed bytes');
      // The signature binds the path and the operation.
      const other = new URL(download);
      other.searchParams.set('path', 'signed/other.txt');
      expect((await fetch(other)).status).toBe(401);
      expect((await fetch(download, { method: 'POST', body: form })).status).toBe(401);
    }));

  it('watches a directory', () =>
    withSandbox(async (sbx) => {
      await sbx.files.makeDir('watched');
      const events: FilesystemEvent[] = [];
      const handle = await sbx.files.watchDir('watched', (event) => void events.push(event), { recursive: true });
      try {
        await sbx.files.write('watched/new.txt', 'x');
        await waitFor(() => Promise.resolve(events.some((e) => e.name === 'new.txt') ? true : undefined), { what: 'a watch event for new.txt' });
        expect(events.map((e) => e.type)).toContain('create');
      } finally {
        await handle.stop();
      }
    }));

  it('runs a pty: input, output, resize', () =>
    withSandbox(async (sbx) => {
      let output = '';
      const pty = await sbx.pty.create({ cols: 80, rows: 24, onData: (data) => void (output += Buffer.from(data).toString()) });
      await sbx.pty.sendInput(pty.pid, new TextEncoder().encode('tty; stty size\n'));
      await waitFor(() => Promise.resolve(/\/dev\/pts\/\d+/.test(output) && /24 80/.test(output) ? true : undefined), { what: 'tty output' });
      await sbx.pty.resize(pty.pid, { cols: 100, rows: 30 });
      await sbx.pty.sendInput(pty.pid, new TextEncoder().encode('stty size; exit\n'));
      await pty.wait();
      expect(output).toMatch(/30 100/);
    }));

  it('pauses (isRunning false), resumes on connect, and keeps processes and files', () =>
    withSandbox(async (sbx) => {
      await sbx.files.write('kept.txt', 'still here');
      const counter = await sbx.commands.run('while true; do sleep 0.05; done', { background: true });
      expect(await sbx.pause()).toBe(true);
      expect(await sbx.isRunning()).toBe(false);
      expect((await sbx.getInfo()).state).toBe('paused');
      expect(await Sandbox.pause(sbx.sandboxId, server.opts)).toBe(false);
      const again = await Sandbox.connect(sbx.sandboxId, server.opts);
      expect(await again.isRunning()).toBe(true);
      expect(await again.files.read('kept.txt')).toBe('still here');
      expect((await again.commands.list()).map((p) => p.pid)).toContain(counter.pid);
      await again.commands.kill(counter.pid);
    }));

  it('shortens the timeout: the sandbox ends when it passes; metrics sample it before', () =>
    withSandbox(async (sbx) => {
      await sbx.setTimeout(1000);
      const info = await sbx.getInfo();
      // Bracketed by this clock, not compared within a tolerance: the server set it before now.
      expect(info.endAt.getTime()).toBeLessThanOrEqual(Date.now() + 1000);
      const [metrics] = await sbx.getMetrics();
      expect(metrics).toMatchObject({ cpuCount: 2, memTotal: 512 * 1024 * 1024, diskTotal: 1024 * 1024 * 1024 });
      expect(metrics?.memUsed).toBeGreaterThan(0);
      await waitFor(async () => ((await sbx.isRunning()) ? undefined : true), { timeoutMs: 15_000, what: 'the sandbox to expire' });
      await expect(Sandbox.connect(sbx.sandboxId, server.opts)).rejects.toBeInstanceOf(SandboxNotFoundError);
    }));

  it('lists by metadata and state, pages with X-Next-Token, and kills', async () => {
    const tag = randomBytes(4).toString('hex');
    const sandboxes = await Promise.all([0, 1, 2].map(() => Sandbox.create({ ...server.opts, timeoutMs: 60_000, metadata: { tag } })));
    try {
      const paginator = Sandbox.list({ ...server.opts, query: { metadata: { tag }, state: ['running'] }, limit: 2 });
      const first = await paginator.nextItems();
      expect(first).toHaveLength(2);
      expect(paginator.hasNext).toBe(true);
      const second = await paginator.nextItems();
      expect(paginator.hasNext).toBe(false);
      const ids = [...first, ...second].map((s) => s.sandboxId).sort();
      expect(ids).toEqual(sandboxes.map((s) => s.sandboxId).sort());
      expect(first[0]).toMatchObject({ metadata: { tag }, state: 'running', templateId: 'base' });
      const none = await Sandbox.list({ ...server.opts, query: { metadata: { tag: 'other' } } }).nextItems();
      expect(none).toEqual([]);
    } finally {
      for (const sbx of sandboxes) expect(await Sandbox.kill(sbx.sandboxId, server.opts)).toBe(true);
    }
    expect(await Sandbox.kill(sandboxes[0]!.sandboxId, server.opts)).toBe(false);
    const left = await Sandbox.list({ ...server.opts, query: { metadata: { tag } } }).nextItems();
    expect(left).toEqual([]);
  });

  it('refuses a bad API key, an unknown sandbox, and an unknown template', async () => {
    await expect(Sandbox.create({ ...server.opts, apiKey: `e2b_${'0'.repeat(40)}` })).rejects.toBeInstanceOf(AuthenticationError);
    await expect(Sandbox.connect('nosuchsandbox', server.opts)).rejects.toBeInstanceOf(SandboxNotFoundError);
    await expect(Sandbox.create('no-such-template', server.opts)).rejects.toThrow(/no template named "no-such-template"/);
  });
});
