import { createHash, randomBytes } from 'node:crypto';
import { mkdir, readdir, readFile, realpath, stat, symlink, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { describeResult, expectNoLeaks, testDataDir, testRunner } from '../helpers/sandbox.js';
import { LocalArtifactStore, isVerifyFailure, type Artifact } from '../../src/store/artifacts/index.js';
import { collectArtifacts } from '../../src/engine/artifacts.js';
import { type ArtifactRef, type DeliveredArtifact } from '../../src/wire/index.js';
import { NamespaceBackend } from '../../src/backends/namespace/namespace-backend.host.js';
import { baseEnv } from '../../src/host/sandbox-layout.js';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { openRegular } from '../../src/host/output-files.host.js';
import { newSandboxId } from '../../src/engine/ids.js';
import { parseSpec } from '../../src/sandbox-spec/index.js';
import { outputLogInfo, readOutputLog } from '../../src/engine/output-log.js';
import { ProcessLogs } from '../../src/engine/process-logs.js';
import type { RunResult } from '../../src/engine/runner.js';

const MiB = 1024 * 1024;
const runner = testRunner();
afterEach(expectNoLeaks);

function sh(script: string, options: Parameters<typeof runner.run>[1] = {}): Promise<RunResult> {
  return runner.run(['bash', '-c', script], options);
}

function byName(result: RunResult): Map<string, ArtifactRef> {
  return new Map((result.artifacts ?? []).map((a) => [a.name, a]));
}

function delivered(ref: ArtifactRef | undefined): DeliveredArtifact {
  if (!ref || 'skipped' in ref) throw new Error(`not delivered: ${JSON.stringify(ref)}`);
  return ref;
}

async function sha256Of(stream: Readable): Promise<{ sha256: string; size: number }> {
  const hash = createHash('sha256');
  let size = 0;
  for await (const chunk of stream) {
    hash.update(chunk as Buffer);
    size += (chunk as Buffer).length;
  }
  return { sha256: hash.digest('hex'), size };
}

/** Every blob file of the run's artifact store. */
async function blobFiles(): Promise<string[]> {
  const root = join(testDataDir(), 'artifacts', 'sha256');
  const files: string[] = [];
  for (const prefix of await readdir(root).catch(() => [] as string[])) {
    for (const name of await readdir(join(root, prefix))) files.push(join(root, prefix, name));
  }
  return files;
}

describe('artifacts leave the sandbox by reference, verified', () => {
  let store: LocalArtifactStore;
  beforeAll(async () => {
    store = await LocalArtifactStore.open({ root: join(testDataDir(), 'artifacts') });
  });
  afterAll(() => store.close());

  it('round-trips a 50 MiB artifact with a matching sha256', async () => {
    const r = await sh('head -c 52428800 /dev/urandom > /workspace/output/big.bin && sha256sum /workspace/output/big.bin', {
      artifacts: {},
    });
    expect(r.outcome, describeResult(r)).toBe('ok');
    const inSandbox = r.stdout.split(' ')[0];
    const big = delivered(byName(r).get('big.bin'));
    expect(big).toMatchObject({ path: '/workspace/output/big.bin', size: 50 * MiB, sha256: inSandbox, uri: `capsule://artifacts/${inSandbox}` });
    expect(await sha256Of(await store.get(big.sha256))).toEqual({ sha256: inSandbox, size: 50 * MiB });
    expect((await store.stat(big.id)).sandboxId).toBe(r.sandboxId);
    expect(r.artifactsTruncated).toBe(false);
  });

  it('skips a file over the per-file cap and flags the total-cap truncation', async () => {
    const r = await sh(
      'cd /workspace/output && head -c 2097152 /dev/zero > a-large.bin && mkdir sub && for f in b c d; do head -c 600000 /dev/urandom > sub/$f.bin; done',
      { artifacts: { maxFileBytes: MiB, maxTotalBytes: 1.5 * MiB } },
    );
    expect(r.outcome, describeResult(r)).toBe('ok');
    expect(r.artifacts).toEqual([
      { name: 'a-large.bin', path: '/workspace/output/a-large.bin', size: 2 * MiB, skipped: 'too_large' },
      expect.objectContaining({ name: 'sub/b.bin', size: 600_000 }),
      expect.objectContaining({ name: 'sub/c.bin', size: 600_000 }),
      { name: 'sub/d.bin', path: '/workspace/output/sub/d.bin', size: 600_000, skipped: 'total_cap' },
    ]);
    expect(r.artifactsTruncated).toBe(true);
    expect(delivered(byName(r).get('sub/c.bin')).sha256).toMatch(/^[0-9a-f]{64}$/);
  });

  it('does not follow a symlink to a host file out of the output directory', async () => {
    const secretDir = join(testDataDir(), `secret-${randomBytes(4).toString('hex')}`);
    const secret = `capsule-secret-${randomBytes(16).toString('hex')}`;
    await mkdir(secretDir, { mode: 0o755 });
    await writeFile(join(secretDir, 'secret.txt'), secret, { mode: 0o644 });
    const r = await sh(
      `cd /workspace/output && ln -s ${secretDir}/secret.txt leak.txt && ln -s ${secretDir} leakdir && ln -s /etc/passwd passwd && echo fine > fine.txt`,
      { artifacts: {} },
    );
    expect(r.outcome, describeResult(r)).toBe('ok');
    const refs = byName(r);
    expect(refs.get('leak.txt')).toEqual({ name: 'leak.txt', path: '/workspace/output/leak.txt', skipped: 'symlink' });
    expect(refs.get('leakdir')).toMatchObject({ skipped: 'symlink' });
    expect(refs.get('passwd')).toMatchObject({ skipped: 'symlink' });
    expect(delivered(refs.get('fine.txt')).size).toBe(5);
    for (const blob of await blobFiles()) expect((await readFile(blob)).includes(secret), blob).toBe(false);
  });

  it('does not follow the output directory itself when the sandbox replaced it by a symlink', async () => {
    const secretDir = join(testDataDir(), `secret-${randomBytes(4).toString('hex')}`);
    const secret = `capsule-secret-${randomBytes(16).toString('hex')}`;
    await mkdir(secretDir, { mode: 0o755 });
    await writeFile(join(secretDir, 'secret.txt'), secret, { mode: 0o644 });
    const r = await sh(`rm -rf /workspace/output && ln -s ${secretDir} /workspace/output`, { artifacts: {}, reportSchema: { type: 'object' } });
    expect(r.outcome, describeResult(r)).toBe('ok');
    expect(r.artifacts).toEqual([{ name: '.', path: '/workspace/output', skipped: 'symlink' }]);
    expect(r.reportError?.code).toBe('REPORT_INVALID');
    expect(r.reportError?.message).toMatch(/is a symlink \(not followed\)/);
    for (const blob of await blobFiles()) expect((await readFile(blob)).includes(secret), blob).toBe(false);
  });

  it('collects the same way from a gVisor sandbox', async () => {
    const r = await sh('head -c 3000000 /dev/urandom > /workspace/output/x.bin && sha256sum /workspace/output/x.bin && ln -s /etc/passwd /workspace/output/link', {
      spec: { backend: 'gvisor' },
      artifacts: {},
    });
    expect(r.outcome, describeResult(r)).toBe('ok');
    expect(r.artifacts).toEqual([
      { name: 'link', path: '/workspace/output/link', skipped: 'symlink' },
      expect.objectContaining({ name: 'x.bin', size: 3_000_000 }),
    ]);
    expect(delivered(byName(r).get('x.bin')).sha256).toBe(r.stdout.split(' ')[0]);
  });

  it('never opens a file outside the workspace through a directory swapped for a link', async () => {
    const base = join(testDataDir(), `swap-${randomBytes(4).toString('hex')}`);
    await mkdir(join(base, 'workspace', 'output'), { recursive: true });
    await mkdir(join(base, 'host'));
    await writeFile(join(base, 'host', 'secret.txt'), 'secret');
    await writeFile(join(base, 'workspace', 'output', 'ok.txt'), 'ok');
    await symlink(join(base, 'host'), join(base, 'workspace', 'swapped'));
    const root = await realpath(join(base, 'workspace'));
    const inside = await openRegular(join(root, 'output', 'ok.txt'), root);
    expect(inside?.info.size).toBe(2);
    await inside?.handle.close();
    expect(await openRegular(join(root, 'swapped', 'secret.txt'), root)).toBeUndefined();
  });

  it('refuses to collect from outside /workspace before starting a sandbox', async () => {
    await expect(sh('true', { artifacts: { dir: '/etc' } })).rejects.toMatchObject({ code: 'INVALID_PATH' });
    await expect(sh('true', { artifacts: { dir: '/workspace/../etc' } })).rejects.toMatchObject({ code: 'INVALID_PATH' });
  });

  it('keeps copying /workspace/output to the host directory and adds artifacts (capsule run --output)', async () => {
    const outputDir = join(testDataDir(), `out-${randomBytes(4).toString('hex')}`);
    const r = await sh('echo hello > /workspace/output/hello.txt', { outputDir });
    expect(r.output?.files).toEqual([{ path: 'hello.txt', size: 6 }]);
    expect(delivered(byName(r).get('hello.txt')).sha256).toBe(createHash('sha256').update('hello\n').digest('hex'));
    expect(await readFile(join(outputDir, 'hello.txt'), 'utf8')).toBe('hello\n');
  });
});

/** Polls `check` every 20 ms until it holds, for at most `timeoutMs`. */
async function waitFor(check: () => Promise<boolean>, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`condition not met within ${timeoutMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

describe('collecting from a live sandbox while a process rewrites a file', () => {
  const WRITER = [
    'import os',
    "os.makedirs('/workspace/output', exist_ok=True)",
    'i = 0',
    'while True:',
    "    with open('/workspace/output/live.bin', 'wb') as f: f.write(bytes([i % 256]) * (2 << 20))",
    '    i += 1',
  ].join('\n');

  it('copies a frozen, consistent file (never torn), thaws, and flags a file that changed during an unfrozen copy', async () => {
    const host = new HostEnvironment({ dataDir: testDataDir() });
    const backend = new NamespaceBackend({ host });
    const store = await LocalArtifactStore.open({ root: join(testDataDir(), 'artifacts') });
    const sandbox = await backend.create(parseSpec({}), { id: newSandboxId() });
    try {
      await sandbox.exec({ argv: ['python3', '-c', WRITER], env: baseEnv(), cwd: '/workspace' });
      const live = join(sandbox.workspaceDir, 'output', 'live.bin');
      const size = async (): Promise<number> => (await stat(live).catch(() => undefined))?.size ?? 0;
      await waitFor(async () => (await size()) > 0);

      // freeze() starts freezing; the kernel says when every task stopped (cgroup.events).
      const events = `/sys/fs/cgroup/unified/${host.cgroupPrefix}${sandbox.id}/cgroup.events`;
      for (let attempt = 0; attempt < 3; attempt++) {
        await sandbox.freeze();
        await waitFor(async () => /^frozen 1$/m.test(await readFile(events, 'utf8')));
        const frozen = await collectArtifacts(sandbox, store, { freeze: false });
        await sandbox.thaw();
        const ref = delivered(frozen.artifacts.find((a) => a.name === 'live.bin'));
        const bytes = await readFile(store.blobPath(ref.sha256));
        expect(bytes.length).toBe(ref.size);
        expect(bytes.every((b) => b === bytes[0]), 'the stored copy mixes two writes').toBe(true);
      }
      const { mtimeMs } = await stat(live);
      await waitFor(async () => (await stat(live)).mtimeMs !== mtimeMs); // thawed: the writer goes on

      let changing = false;
      for (let attempt = 0; attempt < 40 && !changing; attempt++) {
        const unfrozen = await collectArtifacts(sandbox, store, { freeze: false });
        changing = unfrozen.artifacts.some((a) => a.name === 'live.bin' && 'skipped' in a && a.skipped === 'changing');
      }
      expect(changing, 'a file rewritten during the copy was never reported as changing').toBe(true);
    } finally {
      await sandbox.destroy();
      await store.close();
    }
  });
});

describe('the structured report', () => {
  const schema = {
    type: 'object',
    required: ['items'],
    properties: { items: { type: 'array', items: { type: 'object', properties: { price: { type: 'number' } } } } },
  };

  it('comes back as the object when it satisfies its schema', async () => {
    const r = await sh(`echo '{"items":[{"price":1.5}]}' > /workspace/output/report.json`, { reportSchema: schema });
    expect(r.outcome, describeResult(r)).toBe('ok');
    expect(r.report).toEqual({ items: [{ price: 1.5 }] });
    expect(r.reportError).toBeUndefined();
  });

  it('gives REPORT_INVALID with the path of the bad field', async () => {
    const r = await sh(`echo '{"items":[{"price":"free"}]}' > /workspace/output/report.json`, { reportSchema: schema });
    expect(r.report).toBeUndefined();
    expect(r.reportError).toEqual({
      code: 'REPORT_INVALID',
      message: 'report /workspace/output/report.json is invalid at /items/0/price: must be number',
      errors: [{ path: '/items/0/price', message: 'must be number' }],
    });
  });

  it('refuses a report over the size bound with REPORT_TOO_LARGE, never a cut one', async () => {
    const r = await sh(`python3 -c "import json; print(json.dumps({'items': [{'price': 1}] * 1000}))" > /workspace/output/report.json`, {
      reportSchema: schema,
      report: { maxBytes: 1024 },
    });
    expect(r.report).toBeUndefined();
    expect(r.reportError).toMatchObject({ code: 'REPORT_TOO_LARGE', truncated: true, limitBytes: 1024 });
  });

  it('says when a schema was named but no report was written', async () => {
    const r = await sh('true', { reportSchema: schema });
    expect(r.reportError).toMatchObject({ code: 'REPORT_INVALID', errors: [{ path: '', message: 'no report was written at /workspace/output/report.json' }] });
  });
});

describe('diagnostics and output logs', () => {
  it('puts a short diagnostic with the last stderr lines on a failed exec', async () => {
    const r = await sh('for i in $(seq 1 100); do echo "line $i" >&2; done; exit 3');
    expect(r.outcome).toBe('exit_nonzero');
    expect(r.diagnostic).toMatch(/^`bash -c .*` in \/workspace ended after \d+ ms: exit code 3\nlast stderr lines:\nline 81\n/);
    expect(r.diagnostic?.endsWith('line 100')).toBe(true);
    expect(r.diagnostic).not.toContain('line 80\n');
    const ok = await sh('echo fine >&2');
    expect(ok.diagnostic).toBeUndefined();
  });

  it('writes the output to a bounded per-process log and reads it back by pid', async () => {
    const logs = new ProcessLogs({ dataDir: testDataDir(), extraBytes: 8192 });
    const where = { dataDir: testDataDir(), sandboxId: 'logtest', pid: 7 };
    const log = logs.open({ tenantId: 't', ...where }, 0);
    log.append('stdout', Buffer.from('hello '), true);
    log.append('stderr', Buffer.from('oops\n'), true);
    log.append('stdout', Buffer.from('world\n'), true);
    await log.close();
    const entries = [];
    for await (const entry of readOutputLog(where)) entries.push(`${entry.stream}:${entry.data.toString()}`);
    expect(entries).toEqual(['stdout:hello ', 'stderr:oops\n', 'stdout:world\n']);
    const stdoutOnly = [];
    for await (const entry of readOutputLog({ ...where, stream: 'stdout' })) stdoutOnly.push(entry.data.toString());
    expect(stdoutOnly.join('')).toBe('hello world\n');

    // Output past the caps takes the log's extra room, first come first kept; the rest is counted.
    const flood = logs.open({ tenantId: 't', ...where, pid: 8 }, 0);
    for (let i = 0; i < 1000; i++) flood.append('stdout', Buffer.from(`chunk ${i}\n`), false);
    await flood.close();
    expect(flood.droppedBytes).toBeGreaterThan(0);
    const info = await outputLogInfo({ ...where, pid: 8 });
    expect(info.bytes).toBeLessThanOrEqual(8192);
    const kept = [];
    for await (const entry of readOutputLog({ ...where, pid: 8 })) kept.push(entry.data.toString());
    expect(kept.join('').startsWith('chunk 0\nchunk 1\n')).toBe(true);
    await expect(readOutputLog({ ...where, pid: 9 }).next()).rejects.toMatchObject({ code: 'PROCESS_NOT_FOUND' });
    await logs.remove('logtest');
  });
});

describe('LocalArtifactStore', () => {
  const put = (s: LocalArtifactStore, text: string, meta: Partial<Parameters<LocalArtifactStore['put']>[1]> = {}): Promise<Artifact> =>
    s.put(Readable.from([Buffer.from(text)]), { name: 'a.txt', tenantId: 't1', sandboxId: 'sb1', ...meta });

  it('stores content-addressed blobs, deduplicates, scopes by tenant, and deletes', async () => {
    const s = await LocalArtifactStore.open({ root: join(testDataDir(), `store-${randomBytes(4).toString('hex')}`) });
    try {
      const a = await put(s, 'same');
      const b = await put(s, 'same', { name: 'b.txt', tenantId: 't2' });
      expect(a.sha256).toBe(b.sha256);
      expect(a.id).not.toBe(b.id);
      expect(s.blobPath(a.sha256)).toMatch(new RegExp(`/sha256/${a.sha256.slice(0, 2)}/${a.sha256.slice(2)}$`));
      await expect(s.stat(a.id, { tenantId: 't2' })).rejects.toMatchObject({ code: 'NOT_FOUND' });
      expect((await s.list({ tenantId: 't1' })).map((x) => x.name)).toEqual(['a.txt']);
      await s.delete(a.id, { tenantId: 't1' });
      expect((await sha256Of(await s.get(b.sha256))).size).toBe(4); // t2's row still holds the blob
      await s.delete(b.id);
      await expect(s.get(b.sha256)).rejects.toMatchObject({ code: 'NOT_FOUND' });
      await expect(readFile(s.blobPath(a.sha256))).rejects.toMatchObject({ code: 'ENOENT' });
      await expect(s.stat('../../etc/passwd')).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    } finally {
      await s.close();
    }
  });

  it('ends artifacts after their retention and sweeps their blobs (fake clock)', async () => {
    let now = new Date('2026-01-01T00:00:00Z');
    const s = await LocalArtifactStore.open({ root: join(testDataDir(), `store-${randomBytes(4).toString('hex')}`), now: () => now, orphanGraceMs: 0 });
    try {
      const short = await put(s, 'short-lived', { retentionMs: 60_000 });
      const long = await put(s, 'default retention');
      expect(long.expiresAt).toBe('2026-01-08T00:00:00.000Z');
      now = new Date('2026-01-01T00:01:00Z');
      await expect(s.stat(short.id)).rejects.toMatchObject({ code: 'NOT_FOUND' });
      expect(await s.sweepExpired()).toEqual({ expired: 1, blobsRemoved: 1 });
      await expect(readFile(s.blobPath(short.sha256))).rejects.toMatchObject({ code: 'ENOENT' });
      expect((await s.stat(long.sha256)).id).toBe(long.id);
    } finally {
      await s.close();
    }
  });

  it('refuses a copy whose stored size differs from the expected one (verify_failed) and stores nothing', async () => {
    const s = await LocalArtifactStore.open({ root: join(testDataDir(), `store-${randomBytes(4).toString('hex')}`) });
    try {
      const error = await put(s, 'ten bytes!', { expectedSize: 11 }).catch((e: unknown) => e);
      expect(isVerifyFailure(error)).toBe(true);
      expect(await s.list()).toEqual([]);
      expect(await readdir(join(s.root, 'tmp'))).toEqual([]);
      expect(await readdir(join(s.root, 'sha256'))).toEqual([]);
    } finally {
      await s.close();
    }
  });
});
