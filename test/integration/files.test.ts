/**
 * SandboxFiles on real sandboxes: every test gets its own sandbox, destroyed in `finally`, and its
 * id is printed when the test fails. The attack tests plant a random secret in a host file under
 * the test data directory and check that no API call ever returns or changes it.
 */
import { createHash, randomBytes } from 'node:crypto';
import { readFile, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { afterEach, describe, expect, it, onTestFailed } from 'vitest';
import { NamespaceBackend } from '../../src/backends/namespace/namespace-backend.host.js';
import { GvisorBackend } from '../../src/backends/gvisor/gvisor-backend.host.js';
import type { Backend, BackendSandbox } from '../../src/backends/backend.js';
import { newSandboxId } from '../../src/engine/ids.js';
import { createSandboxFiles, type SandboxFileService } from '../../src/engine/files/index.js';
import { isSandboxError, type ErrorCode } from '../../src/errors/index.js';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { parseSpec, type SandboxSpecInput } from '../../src/sandbox-spec/index.js';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';

const MiB = 1024 * 1024;
afterEach(expectNoLeaks);

const host = new HostEnvironment({ dataDir: testDataDir() });
const backends: Record<'namespace' | 'gvisor', Backend> = {
  namespace: new NamespaceBackend({ host }),
  gvisor: new GvisorBackend({ host }),
};
const gvisorProbe = await backends.gvisor.probe();

async function withSandbox(
  spec: SandboxSpecInput,
  body: (files: SandboxFileService, sandbox: BackendSandbox) => Promise<void>,
): Promise<void> {
  const parsed = parseSpec(spec);
  const sandbox = await backends[parsed.backend].create(parsed, { id: newSandboxId() });
  onTestFailed(() => console.error(`files test failed in sandbox ${sandbox.id}`));
  try {
    await body(createSandboxFiles(sandbox), sandbox);
  } finally {
    await sandbox.destroy();
  }
}

/** Runs argv in the sandbox to completion; returns exit code and output. */
async function sh(sandbox: BackendSandbox, script: string, ...args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const proc = await sandbox.exec({ argv: ['sh', '-c', script, 'sh', ...args], env: { PATH: '/usr/bin:/bin' }, cwd: '/workspace' });
  let stdout = '';
  let stderr = '';
  proc.onStdout((chunk) => (stdout += chunk.toString()));
  proc.onStderr((chunk) => (stderr += chunk.toString()));
  const exit = await proc.exited;
  return { code: exit.exitCode, stdout, stderr };
}

async function text(stream: Readable): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of stream) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString('utf8');
}

async function expectCode(promise: Promise<unknown>, code: ErrorCode): Promise<void> {
  const error = await promise.then(
    () => undefined,
    (caught: unknown) => caught,
  );
  expect(error, `expected ${code}`).toBeDefined();
  expect(isSandboxError(error) ? error.code : String(error), String(error)).toBe(code);
}

async function waitFor(condition: () => Promise<boolean> | boolean, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`condition not met within ${timeoutMs} ms`);
    await new Promise((resolve) => setImmediate(resolve));
  }
}

describe('sandbox files: basic operations', () => {
  it('writes and reads back a file, creating parents; relative paths resolve against /workspace', async () => {
    await withSandbox({}, async (files, sandbox) => {
      const entry = await files.write('notes/a b.txt', 'hello\n');
      expect(entry).toMatchObject({ name: 'a b.txt', path: '/workspace/notes/a b.txt', type: 'file', size: 6, mode: 0o644 });
      expect(Date.parse(entry.modifiedAt)).toBeGreaterThan(Date.now() - 60_000);
      expect(await text(await files.read('/workspace/notes/a b.txt'))).toBe('hello\n');
      expect(await text(await files.read('~/notes/a b.txt'))).toBe('hello\n');
      expect((await sh(sandbox, 'cat "/workspace/notes/a b.txt"')).stdout).toBe('hello\n');
      // an empty write makes an empty file; a Buffer and a stream work too
      expect((await files.write('empty', '')).size).toBe(0);
      expect(await text(await files.read('empty'))).toBe('');
      await files.write('stream', Readable.from([Buffer.from('a'), 'b', Buffer.from('c')]));
      expect(await text(await files.read('stream'))).toBe('abc');
      // overwriting keeps the file's mode
      await sh(sandbox, 'chmod 600 /workspace/stream');
      expect((await files.write('stream', Buffer.from('xyz'))).mode).toBe(0o600);
      // no temp file is left next to the target
      expect((await files.list('/workspace')).map((e) => e.name)).toEqual(['empty', 'notes', 'stream']);
    });
  });

  it('lists with depth 1 and 2, and stats files, directories and symlinks', async () => {
    await withSandbox({}, async (files, sandbox) => {
      const made = await sh(sandbox, 'mkdir -p d/sub && printf 12345 > d/f && printf x > d/sub/g && ln -s f d/link && ln -s d dlink');
      expect(made.code, made.stderr).toBe(0);
      const one = await files.list('d');
      expect(one.map((e) => [e.path, e.type])).toEqual([
        ['/workspace/d/f', 'file'],
        ['/workspace/d/link', 'symlink'],
        ['/workspace/d/sub', 'dir'],
      ]);
      expect(one[0]).toMatchObject({ name: 'f', size: 5, mode: 0o644 });
      expect(one[1]?.symlinkTarget).toBe('f');
      const two = await files.list('/workspace/d', 2);
      expect(two.map((e) => e.path)).toEqual(['/workspace/d/f', '/workspace/d/link', '/workspace/d/sub', '/workspace/d/sub/g']);
      // a symlinked directory is listed through the link
      expect((await files.list('dlink')).map((e) => e.path)).toEqual(['/workspace/dlink/f', '/workspace/dlink/link', '/workspace/dlink/sub']);

      expect(await files.stat('d/f')).toMatchObject({ type: 'file', size: 5, name: 'f', path: '/workspace/d/f' });
      expect(await files.stat('d/sub')).toMatchObject({ type: 'dir', name: 'sub' });
      expect(await files.stat('d/link')).toMatchObject({ type: 'symlink', symlinkTarget: 'f' });
      expect(await files.stat('/')).toMatchObject({ type: 'dir', name: '/', path: '/' });
      await expectCode(files.list('d', 0), 'INVALID_ARGUMENT');
      // an unreadable subdirectory leaves its entries out; an unreadable directory itself is an error
      const locked = await sh(sandbox, 'mkdir -p d/locked && touch d/locked/hidden && chmod 000 d/locked');
      expect(locked.code, locked.stderr).toBe(0);
      expect((await files.list('d', 2)).map((e) => e.name)).toEqual(['f', 'link', 'locked', 'sub', 'g']);
      await expectCode(files.list('d/locked'), 'PERMISSION_DENIED');
    });
  });

  it('makes directories, moves and removes', async () => {
    await withSandbox({}, async (files) => {
      expect(await files.mkdir('a/b/c')).toMatchObject({ type: 'dir', path: '/workspace/a/b/c', name: 'c' });
      await expectCode(files.mkdir('a/b/c'), 'ALREADY_EXISTS');
      await files.write('a/file', 'content');
      await expectCode(files.mkdir('a/file'), 'ALREADY_EXISTS');

      expect(await files.move('a/file', 'x/y/moved')).toMatchObject({ path: '/workspace/x/y/moved', type: 'file', size: 7 });
      await expectCode(files.stat('a/file'), 'FILE_NOT_FOUND');
      await files.write('other', 'new');
      expect(await files.move('other', 'x/y/moved')).toMatchObject({ size: 3 }); // replaces, as rename(2)
      expect(await files.move('a/b', 'b2')).toMatchObject({ type: 'dir', path: '/workspace/b2' });
      expect((await files.list('b2')).map((e) => e.name)).toEqual(['c']);
      await expectCode(files.move('missing', 'z'), 'FILE_NOT_FOUND');
      await expectCode(files.move('x/y/moved', 'b2'), 'IS_A_DIRECTORY');
      await expectCode(files.move('/workspace/x', '/workspace/x/y/inside'), 'INVALID_PATH');

      await files.remove('b2');
      await files.remove('x/y/moved');
      await files.remove('never-existed');
      expect((await files.list('.')).map((e) => e.name)).toEqual(['a', 'x']);
      await expectCode(files.remove('/workspace'), 'INVALID_PATH');
    });
  });

  it('maps failures to stable codes', async () => {
    await withSandbox({}, async (files) => {
      await files.write('f', 'x');
      await files.mkdir('d');
      await expectCode(files.read('missing'), 'FILE_NOT_FOUND');
      await expectCode(files.stat('missing'), 'FILE_NOT_FOUND');
      await expectCode(files.list('missing'), 'FILE_NOT_FOUND');
      await expectCode(files.read('d'), 'IS_A_DIRECTORY');
      await expectCode(files.write('d', 'x'), 'IS_A_DIRECTORY');
      await expectCode(files.list('f'), 'NOT_A_DIRECTORY');
      await expectCode(files.stat('f/x'), 'NOT_A_DIRECTORY');
      await expectCode(files.write('f/x', 'x'), 'NOT_A_DIRECTORY');
      await expectCode(files.write('/usr/x', 'x'), 'PERMISSION_DENIED');
      await expectCode(files.mkdir('/etc/x'), 'PERMISSION_DENIED');
      await expectCode(files.remove('/usr/bin/sh'), 'PERMISSION_DENIED');
      await expectCode(files.read(''), 'INVALID_PATH');
      await expectCode(files.stat('a\0b'), 'INVALID_PATH');
      const error = await files.read('missing').catch((caught: unknown) => caught);
      expect(String((error as Error).message)).toBe('read: /workspace/missing does not exist in the sandbox');
    });
  });
});

describe('sandbox files: atomicity, limits and streaming', () => {
  it('writes atomically: a reader in the sandbox never sees a partial file', async () => {
    await withSandbox({}, async (files, sandbox) => {
      const size = 3 * MiB; // several frames per write, so a non-atomic write would be seen half-done
      await files.write('shared', Buffer.alloc(size, 'a'));
      const reader = await sandbox.exec({
        argv: [
          'python3', '-c',
          [
            'import os, sys',
            'reads = bad = 0',
            'while not os.path.exists("/workspace/stop"):',
            '    data = open("/workspace/shared", "rb").read()',
            '    reads += 1',
            `    if len(data) != ${size} or data.count(data[:1]) != len(data): bad += 1`,
            'print(reads, bad)',
          ].join('\n'),
        ],
        env: { PATH: '/usr/bin:/bin' },
        cwd: '/workspace',
      });
      let out = '';
      reader.onStdout((chunk) => (out += chunk.toString()));
      for (let i = 0; i < 10; i++) await files.write('shared', Buffer.alloc(size, i % 2 === 0 ? 'b' : 'a'));
      await files.write('stop', '');
      await reader.exited;
      const [reads, bad] = out.trim().split(' ').map(Number);
      expect(bad, out).toBe(0);
      expect(reads).toBeGreaterThan(10);
    });
  });

  it('reports NO_SPACE when the workspace disk limit or /tmp is full, and leaves no temp file', async () => {
    await withSandbox({ limits: { diskBytes: 4 * MiB, tmpBytes: 2 * MiB } }, async (files) => {
      const error = await files.write('big', Buffer.alloc(16 * MiB)).catch((caught: unknown) => caught);
      expect(isSandboxError(error, 'NO_SPACE'), String(error)).toBe(true);
      expect((error as Error).message).toMatch(/^write: no space left for \/workspace\/big: the workspace disk limit of 4 MiB is reached/);
      expect(await files.list('/workspace')).toEqual([]);
      await expectCode(files.write('/tmp/big', Buffer.alloc(4 * MiB)), 'NO_SPACE');
      expect(await files.list('/tmp')).toEqual([]);
    });
  });

  it('reports FILE_TOO_LARGE past limits.fileSizeBytes and keeps the old content', async () => {
    await withSandbox({ limits: { fileSizeBytes: MiB } }, async (files) => {
      await files.write('f', 'old');
      const error = await files.write('f', Readable.from([Buffer.alloc(3 * MiB)])).catch((caught: unknown) => caught);
      expect(isSandboxError(error, 'FILE_TOO_LARGE'), String(error)).toBe(true);
      expect((error as Error).message).toBe('write: /workspace/f would be larger than the single-file limit of 1 MiB');
      expect(await text(await files.read('f'))).toBe('old');
      expect((await files.list('.')).map((e) => e.name)).toEqual(['f']);
    });
  });

  it('round-trips 100 MiB intact (sha256), streaming both ways', async () => {
    await withSandbox({ limits: { fileSizeBytes: 128 * MiB, diskBytes: 256 * MiB } }, async (files, sandbox) => {
      const total = 100 * MiB;
      const sent = createHash('sha256');
      function* source(): Generator<Buffer> {
        for (let offset = 0; offset < total; offset += 256 * 1024) {
          const chunk = randomBytes(256 * 1024);
          sent.update(chunk);
          yield chunk;
        }
      }
      let started = performance.now();
      const entry = await files.write('big.bin', Readable.from(source()));
      const uploadMs = performance.now() - started;
      expect(entry.size).toBe(total);
      const digest = sent.digest('hex');
      expect((await sh(sandbox, 'sha256sum big.bin')).stdout.split(' ')[0]).toBe(digest);

      started = performance.now();
      const received = createHash('sha256');
      let bytes = 0;
      for await (const chunk of await files.read('big.bin')) {
        received.update(chunk as Buffer);
        bytes += (chunk as Buffer).length;
      }
      const downloadMs = performance.now() - started;
      expect(bytes).toBe(total);
      expect(received.digest('hex')).toBe(digest);
      console.info(`100 MiB: upload ${Math.round(uploadMs)} ms, download ${Math.round(downloadMs)} ms`);
    });
  });

  it('pulls upload data only as fast as the sandbox writes it (flow control)', async () => {
    await withSandbox({}, async (files, sandbox) => {
      const total = 48 * MiB;
      let pulled = 0;
      function* source(): Generator<Buffer> {
        for (; pulled < total; ) {
          pulled += 256 * 1024;
          yield Buffer.alloc(256 * 1024, 'z');
        }
      }
      let isDone = false;
      const writing = files.write('flow', Readable.from(source())).finally(() => (isDone = true));
      let samples = 0;
      let worst = 0;
      while (!isDone) {
        const pulledBefore = pulled;
        const r = await sh(sandbox, 'stat -c %s .capsule-upload-* 2>/dev/null || echo 0');
        const inFile = Number(r.stdout.trim().split('\n')[0]);
        if (inFile > 0) {
          samples += 1;
          worst = Math.max(worst, pulledBefore - inFile);
        }
      }
      expect((await writing).size).toBe(total);
      console.info(`flow control: ${samples} samples, data pulled ahead of the file at most ${(worst / MiB).toFixed(1)} MiB`);
      expect(samples).toBeGreaterThan(0);
      // 4 frames in flight, one being cut, Readable.from's 16-chunk buffer: about 9 MiB at most
      expect(worst).toBeLessThan(12 * MiB);
    });
  });

  it('pauses the reader in the sandbox while the consumer does not read (bounded memory)', async () => {
    await withSandbox({}, async (files, sandbox) => {
      const stream = await files.read('/dev/zero');
      const stoppedCats = async (): Promise<string> =>
        (await sh(sandbox, 'for s in /proc/[0-9]*/stat; do read -r line < "$s" && case "$line" in *"(cat) T "*) echo stopped;; esac; done')).stdout;
      await waitFor(async () => (await stoppedCats()).includes('stopped'));
      console.info(`read back-pressure: ${(stream.readableLength / MiB).toFixed(2)} MiB buffered while the consumer is idle`);
      expect(stream.readableLength).toBeLessThan(8 * MiB);
      let bytes = 0;
      for await (const chunk of stream) {
        bytes += (chunk as Buffer).length;
        if (bytes > 20 * MiB) break; // break destroys the stream, which kills cat
      }
      await waitFor(async () => (await sh(sandbox, 'cat /proc/[0-9]*/stat')).stdout.includes('(cat) T') === false);
    });
  });

  it('bounds what it buffers even when a process in the sandbox keeps resuming the paused reader', async () => {
    await withSandbox({}, async (files, sandbox) => {
      const stream = await files.read('/dev/zero');
      const failed = new Promise<unknown>((resolve) => stream.once('error', resolve));
      const resumer = await sandbox.exec({
        argv: ['sh', '-c', 'while :; do for s in /proc/[0-9]*/stat; do read -r l < "$s" && case "$l" in *"(cat) T "*) kill -CONT "${l%% *}";; esac; done 2>/dev/null; done'],
        env: { PATH: '/usr/bin:/bin' },
        cwd: '/workspace',
      });
      try {
        const error = await failed;
        expect(isSandboxError(error, 'LIMIT_EXCEEDED'), String(error)).toBe(true);
        expect(stream.readableLength).toBeLessThanOrEqual(16 * MiB);
      } finally {
        resumer.signal('SIGKILL');
        await resumer.exited;
      }
    });
  });

  it('aborts a write: the helper stops and its temp file is removed', async () => {
    await withSandbox({}, async (files) => {
      const source = new Readable({ read() {} });
      source.push(Buffer.alloc(2 * MiB, 'x'));
      const controller = new AbortController();
      const writing = files.write('partial', source, { signal: controller.signal });
      await waitFor(async () => (await files.list('.')).some((e) => e.name.startsWith('.capsule-upload-') && e.size >= MiB));
      controller.abort();
      await expectCode(writing, 'ABORTED');
      expect(JSON.stringify(await files.list('.'))).toBe('[]');

      // Whenever the abort lands (before the helper starts, while it sets up, mid-frame), the
      // call settles after the helper is gone and no temp file is left.
      for (let turns = 0; turns < 16; turns++) {
        const data = new Readable({ read() {} });
        data.push(Buffer.alloc((turns % 3) * 700 * 1024 + 1));
        const abort = new AbortController();
        const pending = files.write(`p${turns}`, data, { signal: abort.signal });
        for (let i = 0; i < turns * 8; i++) await new Promise((resolve) => setImmediate(resolve));
        abort.abort();
        await expectCode(pending, 'ABORTED');
        expect(JSON.stringify(await files.list('.')), `aborted after ${turns * 8} event-loop turns`).toBe('[]');
      }
    });
  });

  it('fails a write whose data source breaks, and removes the temp file', async () => {
    await withSandbox({}, async (files) => {
      const source = new Readable({ read() {} });
      source.push(Buffer.alloc(2 * MiB, 'x'));
      const writing = files.write('broken', source);
      await waitFor(async () => (await files.list('.')).some((e) => e.name.startsWith('.capsule-upload-')));
      source.destroy(new Error('client went away'));
      const error = await writing.catch((caught: unknown) => caught);
      expect(isSandboxError(error, 'ABORTED'), String(error)).toBe(true);
      expect((error as Error).message).toMatch(/reading the data to write failed: client went away/);
      await waitFor(async () => (await files.list('.')).length === 0);
    });
  });

  it('times out instead of hanging when the sandbox is frozen', async () => {
    await withSandbox({}, async (files, sandbox) => {
      const quick = createSandboxFiles(sandbox, { timeoutMs: 300 });
      await sandbox.freeze();
      try {
        await expectCode(quick.stat('/workspace'), 'TIMEOUT');
      } finally {
        await sandbox.thaw();
      }
      expect((await quick.stat('/workspace')).type).toBe('dir');
    });
  });

  it('reports LIMIT_EXCEEDED when the sandbox is out of processes', async () => {
    await withSandbox({ limits: { pids: 4 } }, async (files, sandbox) => {
      const fill = [
        'import subprocess, time',
        'children = []',
        'while True:',
        '    try: children.append(subprocess.Popen(["sleep", "100"]))',
        '    except OSError: break',
        'print("ready", len(children), flush=True)',
        'time.sleep(100)',
      ].join('\n');
      const filler = await sandbox.exec({ argv: ['python3', '-c', fill], env: { PATH: '/usr/bin:/bin' }, cwd: '/workspace' });
      let out = '';
      filler.onStdout((chunk) => (out += chunk.toString()));
      await waitFor(() => out.includes('ready'));
      const error = await files.stat('/workspace').catch((caught: unknown) => caught);
      expect(isSandboxError(error, 'LIMIT_EXCEEDED'), String(error)).toBe(true);
      expect((error as Error).message).toMatch(/out of processes \(limits\.pids = 4\)/);
      filler.signal('SIGKILL');
      await filler.exited;
    });
  });

  it('aborts a read and times out an idle one', async () => {
    await withSandbox({}, async (files, sandbox) => {
      const controller = new AbortController();
      const stream = await files.read('/dev/zero', { signal: controller.signal });
      controller.abort();
      await expect(text(stream)).rejects.toMatchObject({ code: 'ABORTED' });
      const idle = createSandboxFiles(sandbox, { idleTimeoutMs: 300 });
      await sh(sandbox, 'mkfifo /workspace/fifo');
      await expectCode(idle.read('fifo'), 'TIMEOUT');
    });
  });
});

describe('sandbox files: watch', () => {
  it('yields create, write and remove events for changes made by another process', async () => {
    await withSandbox({}, async (files, sandbox) => {
      await files.mkdir('sub');
      const watch = files.watch('/workspace', { recursive: true });
      const iterator = watch[Symbol.asyncIterator]();
      const events: string[] = [];
      const collecting = (async () => {
        for (;;) {
          const next = await iterator.next();
          if (next.done === true) return;
          events.push(`${next.value.type} ${next.value.path}`);
          if (next.value.type === 'remove' && next.value.path === '/workspace/sub/f') return;
        }
      })();
      await watch.ready;
      const r = await sh(sandbox, 'echo hi > w.txt && echo more >> w.txt && chmod 600 w.txt && mv w.txt sub/f && rm sub/f');
      expect(r.code, r.stderr).toBe(0);
      await collecting;
      await iterator.return?.();
      // inotify merges an event with an identical one still unread, so repeats are collapsed
      expect(events.filter((event, i) => event !== events[i - 1])).toEqual([
        'create /workspace/w.txt',
        'write /workspace/w.txt',
        'chmod /workspace/w.txt',
        'rename /workspace/w.txt',
        'create /workspace/sub/f',
        'remove /workspace/sub/f',
      ]);
    });
  });

  it('hides its own temp files, reports a missing path, and stops on abort', async () => {
    await withSandbox({}, async (files) => {
      const controller = new AbortController();
      const watch = files.watch('/workspace', { signal: controller.signal });
      const events: string[] = [];
      const collecting = (async () => {
        for await (const event of watch) events.push(`${event.type} ${event.path}`);
      })();
      await watch.ready;
      await files.write('atomic', 'x');
      await waitFor(() => events.includes('create /workspace/atomic'));
      controller.abort();
      await collecting;
      expect(events).toEqual(['create /workspace/atomic']);

      const missing = files.watch('/workspace/missing');
      await expectCode(missing.ready, 'FILE_NOT_FOUND');
      await expectCode((async () => {
        for await (const _ of missing) break;
      })(), 'FILE_NOT_FOUND');
    });
  });
});

describe.each([
  { backend: 'namespace' as const, skip: false },
  { backend: 'gvisor' as const, skip: !gvisorProbe.available },
])('sandbox files on $backend: paths are the sandbox view, never the host', ({ backend, skip }) => {
  it.skipIf(skip)('never reads, lists or changes a host file through symlinks, /proc/1/root or .. (skipped when runsc is unavailable)', async () => {
    const secret = randomBytes(24).toString('hex');
    const marker = join(testDataDir(), `marker-${secret.slice(0, 8)}`);
    await writeFile(marker, secret);
    const hostPasswd = await readFile('/etc/passwd', 'utf8');
    const hostShadow = await readFile('/etc/shadow', 'utf8').catch(() => '');
    try {
      await withSandbox({ backend }, async (files, sandbox) => {
        const links: Record<string, string> = {
          evil: '/etc/shadow',
          passwd: '/proc/1/root/etc/passwd',
          up: '../../../../',
          root: '/',
          data: testDataDir(),
          marker,
          procmarker: `/proc/1/root${marker}`,
          workspace: sandbox.workspaceDir,
        };
        for (const [name, target] of Object.entries(links)) {
          const r = await sh(sandbox, 'ln -s "$1" "/workspace/$2"', target, name);
          expect(r.code, r.stderr).toBe(0);
        }
        const seen: string[] = [];
        const attempt = async (call: () => Promise<unknown>): Promise<void> => {
          try {
            const value = await call();
            seen.push(value instanceof Readable ? await text(value) : JSON.stringify(value));
          } catch (error) {
            seen.push(String((error as Error).message), JSON.stringify((error as { details?: unknown }).details ?? {}));
          }
        };
        const throughLinks = [
          'evil', 'passwd', 'marker', 'procmarker', `up${marker}`, `root${marker}`, `data/${marker.split('/').pop() ?? ''}`,
          `/proc/1/root${marker}`, `../../..${marker}`, marker, `workspace/../${marker.split('/').pop() ?? ''}`,
        ];
        for (const path of throughLinks) {
          await attempt(() => files.read(path));
          await attempt(() => files.stat(path));
        }
        for (const path of ['root', 'up', 'data', 'workspace', 'root/tmp', `root${testDataDir()}`]) await attempt(() => files.list(path, path === 'root' ? 1 : 2));
        await attempt(() => files.move(`root${marker}`, 'stolen'));
        await attempt(() => files.move(marker, 'stolen'));
        for (const path of ['evil', 'passwd', 'marker', 'procmarker', `root${marker}`, `up${marker}`, marker, `data/x`]) {
          await attempt(() => files.write(path, 'pwned'));
        }
        // A write through a link to the host marker's path lands in the sandbox's own /tmp.
        expect(await text(await files.read(marker))).toBe('pwned');
        await attempt(() => files.mkdir(`root${testDataDir()}/made`));
        await attempt(() => files.remove(`root${marker}`));
        await attempt(() => files.remove('marker'));
        await attempt(() => files.remove(`up${testDataDir()}`));

        expect(seen.join('\n')).not.toContain(secret);
        // The sandbox's /etc/passwd is its own, not the host's; /etc/shadow does not exist there.
        const sandboxPasswd = (await sh(sandbox, 'cat /etc/passwd')).stdout;
        expect(sandboxPasswd).not.toBe(hostPasswd);
        expect(await text(await files.read('../../etc/passwd'))).toBe(sandboxPasswd);
        // Through /proc/1/root the API sees exactly what a process in the sandbox sees (gVisor denies it).
        const viaProc = await sh(sandbox, 'cat /workspace/passwd');
        if (viaProc.code === 0) expect(await text(await files.read('passwd'))).toBe(sandboxPasswd);
        else await expectCode(files.read('passwd'), 'PERMISSION_DENIED');
        await expectCode(files.read('evil'), 'FILE_NOT_FOUND');
        await expectCode(files.write('evil', 'x'), 'PERMISSION_DENIED');
      });
      expect(await readFile(marker, 'utf8')).toBe(secret);
      expect(await readFile('/etc/passwd', 'utf8')).toBe(hostPasswd);
      expect(await readFile('/etc/shadow', 'utf8').catch(() => '')).toBe(hostShadow);
    } finally {
      await rm(marker, { force: true });
    }
  });
});

describe('sandbox files on gvisor', () => {
  it.skipIf(!gvisorProbe.available)('round-trips, maps limit errors and watches (skipped when runsc is unavailable)', async () => {
    await withSandbox({ backend: 'gvisor', limits: { fileSizeBytes: MiB } }, async (files) => {
      expect(await files.write('a/b', 'hello')).toMatchObject({ path: '/workspace/a/b', size: 5, type: 'file' });
      expect(await text(await files.read('a/b'))).toBe('hello');
      expect((await files.list('.', 2)).map((e) => e.path)).toEqual(['/workspace/a', '/workspace/a/b']);
      await expectCode(files.write('big', Buffer.alloc(2 * MiB)), 'FILE_TOO_LARGE');
      await expectCode(files.write('/usr/x', 'x'), 'PERMISSION_DENIED');
      await expectCode(files.read('missing'), 'FILE_NOT_FOUND');
      const watch = files.watch('/workspace');
      const iterator = watch[Symbol.asyncIterator]();
      const first = iterator.next();
      await watch.ready;
      await files.mkdir('made');
      expect((await first).value).toEqual({ type: 'create', path: '/workspace/made' });
      await iterator.return?.();
    });
  });
});
