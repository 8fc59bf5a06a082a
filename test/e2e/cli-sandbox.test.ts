import { spawn } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { PassThrough } from 'node:stream';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { main } from '../../src/cli/main.js';
import type { RunningServer } from '../../src/server/bootstrap.js';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';
import { startTestServer } from './server-helpers.js';
import { runCli, type CliRun } from '../helpers/cli.js';

/** `capsule sandbox ...` and `capsule files ...` against a real server, run in-process. */
let server: RunningServer;
let scratch: string;
let env: NodeJS.ProcessEnv;

beforeAll(async () => {
  scratch = await mkdtemp(join(testDataDir(), 'cli-e2e-'));
  const started = await startTestServer();
  server = started.server;
  env = { CAPSULE_URL: started.url, CAPSULE_API_KEY: started.apiKey };
});
afterAll(async () => {
  await server?.close();
  await rm(scratch, { recursive: true, force: true });
});
afterEach(expectNoLeaks);


function capsule(...argv: string[]): Promise<CliRun> {
  return runCli(argv, env);
}

/** Runs with --json (before any `--`) and parses the one object it must print. */
async function json<T = Record<string, unknown>>(...argv: string[]): Promise<T> {
  const dashes = argv.indexOf('--');
  const r = await capsule(...(dashes === -1 ? [...argv, '--json'] : [...argv.slice(0, dashes), '--json', ...argv.slice(dashes)]));
  expect(r.code, `capsule ${argv.join(' ')}: ${r.stderr}`).toBe(0);
  expect(r.stdout.trim().split('\n'), 'exactly one JSON line').toHaveLength(1);
  return JSON.parse(r.stdout) as T;
}

function ndjson(text: string): Record<string, unknown>[] {
  return text
    .trim()
    .split('\n')
    .map((line) => JSON.parse(line) as Record<string, unknown>);
}

async function withSandbox(test: (id: string) => Promise<void>, ...flags: string[]): Promise<void> {
  const created = await json<{ sandboxId: string; state: string }>('sandbox', 'create', '--timeout', '1m', '--metadata', 'suite=cli-e2e', ...flags);
  expect(created.state).toBe('running');
  try {
    await test(created.sandboxId);
  } catch (error) {
    (error as Error).message = `[sandbox ${created.sandboxId}] ${(error as Error).message}`;
    throw error;
  } finally {
    await capsule('sandbox', 'kill', created.sandboxId);
  }
}

describe('capsule sandbox (CLI over a real server)', () => {
  it('create, get, list, exec (json and plain), ps, timeout, keepalive and kill', async () => {
    await withSandbox(
      async (id) => {
        expect(await json('sandbox', 'get', id)).toMatchObject({ sandboxId: id, state: 'running', metadata: { suite: 'cli-e2e' } });
        const listed = await json<{ sandboxes: { sandboxId: string }[] }>('sandbox', 'list', '--metadata', 'suite=cli-e2e', '--state', 'running');
        expect(listed.sandboxes.map((s) => s.sandboxId)).toEqual([id]);

        const exec = await capsule('sandbox', 'exec', id, '--json', '--env', 'WHO=cli', '--', 'sh', '-c', 'echo hi $WHO $MEM; exit 3');
        expect(exec.code).toBe(3);
        const events = ndjson(exec.stdout);
        expect(events[0]).toMatchObject({ type: 'start', sandboxId: id });
        expect(events.filter((e) => e.type === 'stdout').map((e) => e.data).join('')).toBe('hi cli small\n');
        expect(events.at(-1)).toMatchObject({ type: 'exit', result: { outcome: 'exit_nonzero', exitCode: 3 } });

        const plain = await capsule('sandbox', 'exec', id, '--', 'sh', '-c', 'echo out; echo err >&2');
        expect(plain).toEqual({ code: 0, stdout: 'out\n', stderr: 'err\n' });
        const timedOut = await capsule('sandbox', 'exec', id, '--timeout', '300ms', '--', 'sleep', '30');
        expect(timedOut.code).toBe(124);
        expect(timedOut.stderr).toMatch(/limit exceeded \(wall_clock\)/);

        const bg = await json<{ sandboxId: string; pid: number }>('sandbox', 'exec', id, '--background', '--', 'sleep', '30');
        expect(bg).toMatchObject({ sandboxId: id, pid: expect.any(Number) as unknown });
        const ps = await json<{ processes: { pid: number; running: boolean }[] }>('sandbox', 'ps', id);
        expect(ps.processes.find((p) => p.pid === bg.pid)?.running).toBe(true);

        const shortened = await json<{ expiresAt: string }>('sandbox', 'timeout', id, '30s');
        expect(Date.parse(shortened.expiresAt) - Date.now()).toBeLessThanOrEqual(30_000);
        const renewed = await json<{ expiresAt: string }>('sandbox', 'keepalive', id);
        expect(Date.parse(renewed.expiresAt)).toBeGreaterThan(Date.parse(shortened.expiresAt));

        expect(await json('sandbox', 'kill', id)).toMatchObject({ sandboxId: id, state: 'killed' });
      },
      '--memory',
      '128MiB',
      '--env',
      'MEM=small',
    );
  });

  it('prints create without --json as the bare id, and errors as one JSON object with a non-zero exit', async () => {
    const created = await capsule('sandbox', 'create', '--timeout', '30s');
    const id = created.stdout.trim();
    expect(id).toMatch(/^[a-z2-7]{20}$/);
    await capsule('sandbox', 'kill', id);

    const missing = await capsule('sandbox', 'get', 'a'.repeat(20), '--json');
    expect(missing.code).not.toBe(0);
    expect(JSON.parse(missing.stdout)).toMatchObject({ error: { code: 'SANDBOX_NOT_FOUND', message: expect.any(String) as unknown, hint: expect.any(String) as unknown } });

    const badKey = await main(['node', 'capsule', 'sandbox', 'list', '--json', '--api-key', `cap_${'0'.repeat(40)}`], {
      stdout: new PassThrough(),
      stderr: new PassThrough(),
      env,
    });
    expect(badKey).not.toBe(0);

    const unreachable = await capsule('sandbox', 'list', '--json', '--url', 'http://127.0.0.1:9');
    expect(JSON.parse(unreachable.stdout)).toMatchObject({ error: { code: 'SERVER_UNREACHABLE' } });
    expect(unreachable.code).not.toBe(0);
  });
});

describe('capsule files (CLI over a real server)', () => {
  it('write, read, list, stat, mkdir, move, remove and watch, each with --json', async () => {
    await withSandbox(async (id) => {
      const hostFile = join(scratch, 'upload.txt');
      await writeFile(hostFile, 'from the host\n');
      expect(await json('files', 'write', id, 'in/up.txt', '--from', hostFile)).toMatchObject({ path: '/workspace/in/up.txt', size: 14 });
      expect(await json('files', 'write', id, 'note.txt', '--data', 'hé')).toMatchObject({ path: '/workspace/note.txt', size: 3 });
      expect(await json('files', 'read', id, 'in/up.txt')).toEqual({ path: 'in/up.txt', size: 14, encoding: 'utf8', content: 'from the host\n' });
      expect((await capsule('files', 'read', id, 'note.txt')).stdout).toBe('hé');

      const listed = await json<{ entries: { path: string }[] }>('files', 'list', id, '/workspace', '--depth', '2');
      expect(listed.entries.map((e) => e.path)).toEqual(expect.arrayContaining(['/workspace/in', '/workspace/in/up.txt', '/workspace/note.txt']));
      expect(await json('files', 'stat', id, 'note.txt')).toMatchObject({ type: 'file', size: 3 });
      expect(await json('files', 'mkdir', id, 'out/deep')).toMatchObject({ type: 'dir', path: '/workspace/out/deep' });
      expect(await json('files', 'move', id, 'note.txt', 'out/deep/note.txt')).toMatchObject({ path: '/workspace/out/deep/note.txt' });
      expect(await json('files', 'remove', id, 'out')).toEqual({ path: 'out', removed: true });

      const gone = await capsule('files', 'stat', id, 'out', '--json');
      expect(gone.code).not.toBe(0);
      expect(JSON.parse(gone.stdout)).toMatchObject({ error: { code: 'FILE_NOT_FOUND' } });

      // The watch prints its first event and stops (--count 1). It says nothing when it is in
      // place, so a file is written again and again (the next one once the last write returned)
      // until the watch has one; --duration bounds the watch and the loop alike.
      const watching = capsule('files', 'watch', id, '/workspace', '--json', '--count', '1', '--duration', '30s');
      let done = false;
      void watching.then(() => (done = true));
      for (let n = 0; !done; n++) await capsule('files', 'write', id, `w${n}.txt`, '--data', 'x');
      const watched = await watching;
      expect(watched.code).toBe(0);
      expect(ndjson(watched.stdout)).toEqual([expect.objectContaining({ path: expect.stringMatching(/^\/workspace\/w\d+\.txt$/) as unknown })]);
    });
  });
});

describe('capsule as a separate process (bin/capsule.js, built dist)', () => {
  const CLI = join(import.meta.dirname, '..', '..', 'bin', 'capsule.js');

  /**
   * Runs the CLI as its own process. A CLI held by an idle connection would live until the SDK's
   * idle-socket timeout (30 s) closes it; the guard kills it before that, so a held CLI fails
   * with code -1 (killed) instead of passing slowly. A CLI that is not held exits long before.
   */
  function spawnCli(args: string[], stdin: string): Promise<CliRun> {
    return new Promise((resolve, reject) => {
      const child = spawn(process.execPath, [CLI, ...args], { env: { PATH: process.env.PATH, ...env }, stdio: ['pipe', 'pipe', 'pipe'] });
      const guard = setTimeout(() => child.kill('SIGKILL'), 25_000);
      let stdout = '';
      let stderr = '';
      child.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
      child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
      child.once('error', reject);
      child.once('close', (code) => {
        clearTimeout(guard);
        resolve({ code: code ?? -1, stdout, stderr });
      });
      child.stdin.end(stdin);
    });
  }

  it('kills the command in the sandbox on Ctrl-C and exits 130', async () => {
    await withSandbox(async (id) => {
      const child = spawn(process.execPath, [CLI, 'sandbox', 'exec', id, '--json', '--', 'sleep', '30'], {
        env: { PATH: process.env.PATH, ...env },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      let stdout = '';
      let interrupted = false;
      const closed = new Promise<number | null>((resolve) => child.once('close', resolve));
      child.stdout.on('data', (c: Buffer) => {
        stdout += c.toString();
        if (!interrupted && stdout.includes('"type":"start"')) interrupted = child.kill('SIGINT');
      });
      expect(await closed).toBe(130);
      const lines = ndjson(stdout);
      const pid = lines[0]?.pid as number;
      expect(lines.at(-1)).toMatchObject({ error: { code: 'ABORTED' } });
      const ps = await json<{ processes: { pid: number; running: boolean }[] }>('sandbox', 'ps', id);
      expect(ps.processes.find((p) => p.pid === pid)?.running).toBe(false);
    });
  });

  it('uploads stdin with write --from -, and exits promptly after exec (no connection keeps it alive)', async () => {
    await withSandbox(async (id) => {
      const written = await spawnCli(['files', 'write', id, 'piped.txt', '--from', '-', '--json'], 'piped through stdin\n');
      expect(written.code, written.stderr).toBe(0);
      expect(JSON.parse(written.stdout)).toMatchObject({ path: '/workspace/piped.txt', size: 20 });
      // Exiting by itself (code 0, not killed by spawnCli's guard) is the proof that no idle
      // keep-alive socket holds the process.
      const exec = await spawnCli(['sandbox', 'exec', id, '--', 'cat', 'piped.txt'], '');
      expect(exec).toMatchObject({ code: 0, stdout: 'piped through stdin\n' });
      const fed = await spawnCli(['sandbox', 'exec', id, '--stdin', '--', 'wc', '-c'], 'twelve bytes');
      expect(fed).toMatchObject({ code: 0, stdout: '12\n' });
    });
  });
});
