import { existsSync, mkdtempSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { StoredDisks } from '../../src/host/stored-disks.host.js';
import { ConflictError, NotFoundError, Sandbox, Snapshots, type ConnectionOptions } from '../../src/sdk/index.js';
import type { SnapshotInfo } from '../../src/wire/index.js';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';
import { startTestServer, waitFor, type TestServer } from './server-helpers.js';

/**
 * Snapshots and create-from-snapshot over /v1 and the SDK, on real sandboxes and the real btrfs
 * volume, with two real tenants (two API keys).
 */
afterEach(expectNoLeaks);

const host = new HostEnvironment({ dataDir: testDataDir() });
const gvisorReady = existsSync('/usr/local/bin/runsc') || existsSync('/usr/bin/runsc');
const COUNTER = 'i=0; while :; do i=$((i+1)); echo $i > /workspace/n.tmp; mv /workspace/n.tmp /workspace/n; sleep 0.02; done';

async function sh(sandbox: Sandbox, line: string): Promise<string> {
  const result = await sandbox.commands.run(['/bin/sh', '-c', line]);
  expect(result.exitCode, `${line}: ${result.stderr}`).toBe(0);
  return result.stdout;
}

async function counter(sandbox: Sandbox): Promise<number> {
  return Number((await sandbox.commands.run(['/bin/sh', '-c', 'cat /workspace/n 2>/dev/null || echo 0'])).stdout.trim());
}

async function counterAbove(sandbox: Sandbox, than: number): Promise<number> {
  return waitFor(async () => {
    const n = await counter(sandbox);
    return n > than ? n : undefined;
  }, { timeoutMs: 15_000, intervalMs: 30, what: `the counter of ${sandbox.sandboxId} above ${than}` });
}

async function mintTenant(t: TestServer, tenantId: string): Promise<ConnectionOptions> {
  const minted = await t.json<{ apiKey: string }>('POST', '/v1/keys', { body: { tenantId } });
  expect(minted.status, JSON.stringify(minted.body)).toBe(201);
  return { url: t.url, apiKey: minted.body.apiKey };
}

/** Kills every sandbox and deletes every snapshot the connection's tenant still has. */
async function cleanUp(conn: ConnectionOptions): Promise<void> {
  for await (const info of Sandbox.listAll({ ...conn, state: ['running', 'paused', 'starting'] })) await (await Sandbox.connect(info.sandboxId, conn)).kill();
  for (const snapshot of await Snapshots.list(conn)) await Snapshots.delete(snapshot.snapshotId, conn);
}

describe.each([
  { backend: 'namespace' as const, skip: false },
  { backend: 'gvisor' as const, skip: !gvisorReady },
])('snapshots on $backend', ({ backend, skip }) => {
  it.skipIf(skip)('a running sandbox is snapshotted without noticing; a sandbox made from it has its files back', async () => {
    const t = await startTestServer();
    const conn = { url: t.url, apiKey: t.apiKey };
    try {
      const source = await Sandbox.create({ backend, ttlMs: 120_000 }, conn);
      await sh(source, 'echo hello > /workspace/notes.txt && mkdir -p /workspace/src && echo "print(1)" > /workspace/src/main.py');
      await source.commands.run(['/bin/sh', '-c', COUNTER], { background: true });
      const before = await counterAbove(source, 3);

      const snapshot = await source.snapshot({ name: 'before the break' });
      expect(snapshot).toMatchObject({ name: 'before the break', mode: 'filesystem', sandboxId: source.sandboxId, template: 'host', backend, disk: 'workspace' });
      expect(snapshot.snapshotId).toMatch(/^snap_[a-z2-7]{20}$/);
      // Its size is counted just after it is taken.
      const sized = await waitFor(async () => (await Snapshots.get(snapshot.snapshotId, conn)).sizeBytes, { what: 'the snapshot size' });
      expect(sized).toBeGreaterThan(0);
      expect(Date.parse(snapshot.createdAt)).not.toBeNaN();
      // The freeze was for the instant: the source is running and its counter goes on.
      expect((await source.getInfo()).state).toBe('running');
      await counterAbove(source, before + 5);

      // Break things in the source; the snapshot does not change.
      await sh(source, 'rm -rf /workspace/notes.txt /workspace/src && echo broken > /workspace/broken');

      const restored = await Sandbox.create({ snapshot: snapshot.snapshotId }, conn);
      try {
        expect(restored.info.origin).toEqual({ snapshotId: snapshot.snapshotId });
        expect(restored.info.spec.backend).toBe(backend);
        expect(await sh(restored, 'cat /workspace/notes.txt /workspace/src/main.py')).toBe('hello\nprint(1)\n');
        expect(await sh(restored, 'test -e /workspace/broken && echo yes || echo no')).toBe('no\n');
        // The counter's file is whole: the snapshot caught a moment between two writes.
        expect(await sh(restored, 'cat /workspace/n')).toMatch(/^\d+\n$/);
        // The copy is its own, and writable by its sandbox's user.
        await sh(restored, 'echo changed > /workspace/notes.txt && touch /workspace/new');
        expect(await sh(source, 'test -e /workspace/notes.txt && echo yes || echo no')).toBe('no\n');
        const second = await Sandbox.create({ snapshot: snapshot.snapshotId }, conn);
        expect(await sh(second, 'cat /workspace/notes.txt')).toBe('hello\n');
        await second.kill();

        // A snapshot some live sandbox came from is kept: deleting it is refused until it ends.
        const refused = await Snapshots.delete(snapshot.snapshotId, conn).catch((error: unknown) => error);
        expect(refused).toBeInstanceOf(ConflictError);
        expect((refused as ConflictError).details).toMatchObject({ sandboxes: [restored.sandboxId] });
      } finally {
        await restored.kill();
      }
      await source.kill();
      await Snapshots.delete(snapshot.snapshotId, conn);
      expect(existsSync(join(host.volume.mountPoint, 'snapshots', snapshot.snapshotId))).toBe(false);
      expect(await Snapshots.get(snapshot.snapshotId, conn).catch((error: unknown) => error)).toBeInstanceOf(NotFoundError);
    } finally {
      await cleanUp(conn);
      await t.server.close();
    }
  }, 120_000);

  it.skipIf(skip)('a paused sandbox is snapshotted as it is, and stays paused', async () => {
    const t = await startTestServer();
    const conn = { url: t.url, apiKey: t.apiKey };
    try {
      const source = await Sandbox.create({ backend, ttlMs: 120_000 }, conn);
      await sh(source, 'echo paused-state > /workspace/state');
      await source.pause();
      const snapshot = await source.snapshot();
      expect((await source.getInfo()).state).toBe('paused');
      const made = await Sandbox.create({ snapshot: snapshot.snapshotId }, conn);
      expect(await sh(made, 'cat /workspace/state')).toBe('paused-state\n');
    } finally {
      await cleanUp(conn);
      await t.server.close();
    }
  }, 120_000);
});

describe('snapshots belong to a tenant', () => {
  it('another tenant can neither see, use, delete nor take them', async () => {
    const t = await startTestServer();
    const alice = await mintTenant(t, 'alice');
    const bob = await mintTenant(t, 'bob');
    try {
      const source = await Sandbox.create({ ttlMs: 60_000 }, alice);
      await sh(source, 'echo alice-secret > /workspace/secret');
      const snapshot = await source.snapshot();
      expect((await Snapshots.list(alice)).map((s) => s.snapshotId)).toEqual([snapshot.snapshotId]);
      expect(await Snapshots.list(bob)).toEqual([]);

      const get = await t.json<{ code: string }>('GET', `/v1/snapshots/${snapshot.snapshotId}`, { key: bob.apiKey });
      expect(get.status).toBe(404);
      expect(get.body.code).toBe('SNAPSHOT_NOT_FOUND');
      const use = await t.json<{ code: string }>('POST', '/v1/sandboxes', { key: bob.apiKey, body: { spec: { snapshot: snapshot.snapshotId } } });
      expect(use.status).toBe(404);
      expect(use.body.code).toBe('SNAPSHOT_NOT_FOUND');
      const del = await t.json<{ code: string }>('DELETE', `/v1/snapshots/${snapshot.snapshotId}`, { key: bob.apiKey });
      expect(del.status).toBe(404);
      const take = await t.json<{ code: string }>('POST', `/v1/sandboxes/${source.sandboxId}/snapshots`, { key: bob.apiKey, body: {} });
      expect(take.status).toBe(404);
      expect(take.body.code).toBe('SANDBOX_NOT_FOUND');
      const fork = await t.json<{ code: string }>('POST', `/v1/sandboxes/${source.sandboxId}/fork`, { key: bob.apiKey, body: { count: 1 } });
      expect(fork.status).toBe(404);
      // Still Alice's, whole.
      const made = await Sandbox.create({ snapshot: snapshot.snapshotId }, alice);
      expect(await sh(made, 'cat /workspace/secret')).toBe('alice-secret\n');
      expect(await Sandbox.list(bob).then((page) => page.sandboxes)).toEqual([]);
    } finally {
      await cleanUp(alice);
      await cleanUp(bob);
      await t.server.close();
    }
  }, 120_000);

  it('the namespace backend refuses mode full (snapshot and fork) with a stable code and a hint', async () => {
    const t = await startTestServer();
    const conn = { url: t.url, apiKey: t.apiKey };
    try {
      const source = await Sandbox.create({ ttlMs: 60_000 }, conn);
      const refused = await t.json<{ code: string; hint: string }>('POST', `/v1/sandboxes/${source.sandboxId}/snapshots`, { body: { mode: 'full' } });
      expect(refused.status).toBe(422);
      expect(refused.body.code).toBe('BACKEND_CANNOT_ENFORCE');
      expect(refused.body.hint).toContain('filesystem');
      const fork = await t.json<{ code: string; hint: string }>('POST', `/v1/sandboxes/${source.sandboxId}/fork`, { body: { count: 2, mode: 'full' } });
      expect(fork.status).toBe(422);
      expect(fork.body.code).toBe('BACKEND_CANNOT_ENFORCE');
      expect(fork.body.hint).toContain('gvisor');
      expect(await Snapshots.list(conn)).toEqual([]);
      expect((await Sandbox.list(conn)).sandboxes).toHaveLength(1);
    } finally {
      await cleanUp(conn);
      await t.server.close();
    }
  }, 60_000);
});

describe('snapshots outlive the server', () => {
  it('a snapshot taken before a restart is listed and usable after it', async () => {
    const dbDir = mkdtempSync(join(testDataDir(), 'server-db-'));
    const first = await startTestServer({ databaseDir: dbDir });
    const conn = { url: first.url, apiKey: first.apiKey };
    let snapshot: SnapshotInfo;
    try {
      const source = await Sandbox.create({ ttlMs: 60_000 }, conn);
      await sh(source, 'echo kept > /workspace/kept');
      snapshot = await source.snapshot({ name: 'keep me' });
      await source.kill();
    } finally {
      await first.server.close();
    }
    const second = await startTestServer({ databaseDir: dbDir, env: { CAPSULE_API_KEY: first.apiKey } });
    const again = { url: second.url, apiKey: first.apiKey };
    try {
      expect((await Snapshots.list(again)).map((s) => ({ ...s, sizeBytes: undefined }))).toEqual([{ ...snapshot, sizeBytes: undefined }]);
      const made = await Sandbox.create({ snapshot: snapshot.snapshotId }, again);
      expect(await sh(made, 'cat /workspace/kept')).toBe('kept\n');
    } finally {
      await cleanUp(again);
      await second.server.close();
    }
  }, 120_000);
});

describe('fork', () => {
  it('N sandboxes from one snapshot, each its own copy; the source runs on', async () => {
    const t = await startTestServer();
    const conn = { url: t.url, apiKey: t.apiKey };
    try {
      const source = await Sandbox.create({ ttlMs: 120_000 }, conn);
      await sh(source, 'echo base > /workspace/f');
      const { snapshot, forks } = await source.fork(3, { metadata: { experiment: 'e1' } });
      expect(forks).toHaveLength(3);
      expect(snapshot.sandboxId).toBe(source.sandboxId);
      const sandboxes = forks.map((entry, index) => {
        if (!('sandbox' in entry)) throw new Error(`fork ${index} failed: ${entry.error.message}`);
        return entry.sandbox;
      });
      await Promise.all(sandboxes.map((fork, index) => sh(fork, `echo fork-${index} >> /workspace/f`)));
      for (const [index, fork] of sandboxes.entries()) {
        expect(fork.info.origin).toEqual({ snapshotId: snapshot.snapshotId });
        expect(fork.info.metadata).toMatchObject({ experiment: 'e1', forkOf: source.sandboxId, forkIndex: String(index) });
        expect(await sh(fork, 'cat /workspace/f')).toBe(`base\nfork-${index}\n`);
      }
      expect(await sh(source, 'cat /workspace/f')).toBe('base\n');
      expect((await source.getInfo()).state).toBe('running');
    } finally {
      await cleanUp(conn);
      await t.server.close();
    }
  }, 120_000);

  it('a fork beyond the tenant quota makes nothing', async () => {
    const t = await startTestServer({ maxSandboxesPerTenant: 3 });
    const conn = { url: t.url, apiKey: t.apiKey };
    try {
      const source = await Sandbox.create({ ttlMs: 60_000 }, conn);
      const refused = await t.json<{ code: string }>('POST', `/v1/sandboxes/${source.sandboxId}/fork`, { body: { count: 3 } });
      expect(refused.status).toBe(429);
      expect(refused.body.code).toBe('QUOTA_EXCEEDED');
      expect((await Sandbox.list(conn)).sandboxes).toHaveLength(1);
      expect(await Snapshots.list(conn)).toEqual([]);
    } finally {
      await cleanUp(conn);
      await t.server.close();
    }
  }, 60_000);
});

/** Counts in the shell's memory and writes "TOKEN COUNT": a process started anew would have another token and start at 1. */
const TOKEN_COUNTER = 't=$(od -An -N8 -tx1 /dev/urandom | tr -d " \\n"); i=0; while :; do i=$((i+1)); echo "$t $i" > /workspace/c.tmp; mv /workspace/c.tmp /workspace/c; sleep 0.02; done';

async function tokenCount(sandbox: Sandbox): Promise<{ token: string; count: number }> {
  const [token = '', count = '0'] = (await sh(sandbox, 'cat /workspace/c 2>/dev/null || echo - 0')).trim().split(' ');
  return { token, count: Number(count) };
}

async function tokenCountAbove(sandbox: Sandbox, than: number): Promise<{ token: string; count: number }> {
  return waitFor(async () => {
    const read = await tokenCount(sandbox);
    return read.count > than ? read : undefined;
  }, { timeoutMs: 30_000, intervalMs: 50, what: `the counter of ${sandbox.sandboxId} above ${than}` });
}

async function mainResult(sandbox: Sandbox, code: string, contextId: string): Promise<string | undefined> {
  const execution = await sandbox.runCode(code, { contextId });
  expect(execution.error, JSON.stringify(execution.error)).toBeUndefined();
  return execution.results.find((r) => r.isMainResult)?.text;
}

describe('full snapshots on gVisor (processes and memory)', () => {
  const limits = { memoryBytes: 1024 * 1024 ** 2, pids: 256, wallClockMs: 600_000 };

  it.skipIf(!gvisorReady)('fork x3 with mode full: each fork goes on with the Python variable and the counting process; the source is unharmed', async () => {
    const t = await startTestServer();
    const conn = { url: t.url, apiKey: t.apiKey };
    try {
      const source = await Sandbox.create({ backend: 'gvisor', ttlMs: 180_000, limits }, conn);
      const context = await source.contexts.create({ language: 'python' });
      const x = await mainResult(source, 'import secrets\nx = secrets.token_hex(8)\nx', context.id);
      expect(x).toMatch(/^'[0-9a-f]{16}'$/);
      await source.commands.run(['/bin/sh', '-c', TOKEN_COUNTER], { background: true, tag: 'counter' });
      const before = await tokenCountAbove(source, 3);

      const { snapshot, forks } = await source.fork(3, { mode: 'full' });
      expect(snapshot).toMatchObject({ mode: 'full', backend: 'gvisor', sandboxId: source.sandboxId });
      expect(snapshot.checkpoint?.contexts).toEqual([{ id: context.id, language: 'python' }]);
      // The agent's own processes aside: the counter and the context's driver at least.
      expect(snapshot.checkpoint?.processCount).toBeGreaterThanOrEqual(2);
      const sandboxes = forks.map((entry, index) => {
        if (!('sandbox' in entry)) throw new Error(`fork ${index} failed: ${entry.error.code}: ${entry.error.message}`);
        return entry.sandbox;
      });
      expect(new Set(sandboxes.map((f) => f.sandboxId)).size).toBe(3);
      // Another tenant can neither restore the memory in it nor fork the source.
      const bob = await mintTenant(t, 'bob');
      const stolen = await t.json<{ code: string }>('POST', '/v1/sandboxes', { key: bob.apiKey, body: { spec: { snapshot: snapshot.snapshotId } } });
      expect(stolen.status).toBe(404);
      expect(stolen.body.code).toBe('SNAPSHOT_NOT_FOUND');
      expect((await t.json('POST', `/v1/sandboxes/${source.sandboxId}/fork`, { key: bob.apiKey, body: { count: 1, mode: 'full' } })).status).toBe(404);

      for (const [index, fork] of sandboxes.entries()) {
        expect(fork.info).toMatchObject({ origin: { snapshotId: snapshot.snapshotId }, backend: 'gvisor', state: 'running' });
        expect(fork.info.spec.limits.memoryBytes).toBe(limits.memoryBytes);
        // The same counting process, not a new one: its token, and a count past the snapshot's.
        const at = await tokenCount(fork);
        expect(at.token).toBe(before.token);
        expect(at.count).toBeGreaterThanOrEqual(before.count);
        expect((await tokenCountAbove(fork, at.count + 5)).token).toBe(before.token);
        // It is listed, with the argv it was started with.
        const listed = await fork.commands.list();
        expect(listed.find((p) => p.tag === 'counter')).toMatchObject({ running: true, argv: ['/bin/sh', '-c', TOKEN_COUNTER] });
        // The interpreter context is there under its id, with its variable; each fork changes it its own way.
        expect((await fork.contexts.list()).map((c) => c.id)).toContain(context.id);
        expect(await mainResult(fork, 'x', context.id)).toBe(x);
        await mainResult(fork, `x = x + "-fork-${index}"`, context.id);
        await sh(fork, `echo fork-${index} > /workspace/mine`);
      }
      for (const [index, fork] of sandboxes.entries()) {
        expect(await mainResult(fork, 'x', context.id)).toBe(`${x!.slice(0, -1)}-fork-${index}'`);
        expect(await sh(fork, 'cat /workspace/mine')).toBe(`fork-${index}\n`);
      }

      // The source ran on: its variable, its counter (same token, counting), its files.
      expect((await source.getInfo()).state).toBe('running');
      expect(await mainResult(source, 'x', context.id)).toBe(x);
      expect((await tokenCountAbove(source, before.count + 5)).token).toBe(before.token);
      expect(await sh(source, 'test -e /workspace/mine && echo yes || echo no')).toBe('no\n');

      for (const fork of sandboxes) await fork.kill();
      await source.kill();
      await Snapshots.delete(snapshot.snapshotId, conn);
      expect(existsSync(join(host.volume.mountPoint, 'snapshots', snapshot.snapshotId))).toBe(false);
    } finally {
      await cleanUp(conn);
      await t.server.close();
    }
  }, 300_000);

  it.skipIf(!gvisorReady)('a full snapshot outlives the server: created from after a restart, its processes resume; its spec is the source\'s', async () => {
    const dbDir = mkdtempSync(join(testDataDir(), 'server-db-'));
    const first = await startTestServer({ databaseDir: dbDir });
    const conn = { url: first.url, apiKey: first.apiKey };
    let snapshot: SnapshotInfo;
    let before: { token: string; count: number };
    try {
      const source = await Sandbox.create({ backend: 'gvisor', ttlMs: 120_000, limits, env: { WHO: 'source' } }, conn);
      await sh(source, 'echo kept > /workspace/kept');
      await source.commands.run(['/bin/sh', '-c', TOKEN_COUNTER], { background: true });
      before = await tokenCountAbove(source, 3);
      snapshot = await source.snapshot({ mode: 'full', name: 'with processes' });
      expect(snapshot.checkpoint?.contexts).toEqual([]);
      // Its checkpoint image is stored, and charged to the tenant's quota with its disk.
      const imageBytes = await new StoredDisks(new HostEnvironment({ dataDir: testDataDir() }).volume).checkpointBytes(snapshot.snapshotId);
      expect(imageBytes).toBeGreaterThan(1024 * 1024);
      expect(snapshot.chargedBytes).toBeGreaterThanOrEqual(imageBytes);
      // A full snapshot restores under the source's spec: another one is refused, by field.
      const refused = await first.json<{ code: string; details: { field: string } }>('POST', '/v1/sandboxes', { body: { spec: { snapshot: snapshot.snapshotId, limits: { memoryBytes: 256 * 1024 ** 2 } } } });
      expect(refused.status).toBe(422);
      expect(refused.body).toMatchObject({ code: 'INVALID_SPEC', details: { field: 'limits' } });
      await source.kill();
    } catch (error) {
      await cleanUp(conn);
      throw error;
    } finally {
      await first.server.close();
    }
    const second = await startTestServer({ databaseDir: dbDir, env: { CAPSULE_API_KEY: first.apiKey } });
    const again = { url: second.url, apiKey: first.apiKey };
    try {
      const made = await Sandbox.create({ snapshot: snapshot.snapshotId, ttlMs: 90_000 }, again);
      expect(made.info.spec).toMatchObject({ backend: 'gvisor', env: { WHO: 'source' }, ttlMs: 90_000, limits: { memoryBytes: limits.memoryBytes } });
      expect(await sh(made, 'cat /workspace/kept')).toBe('kept\n');
      const resumed = await tokenCountAbove(made, before.count);
      expect(resumed.token).toBe(before.token);
    } finally {
      await cleanUp(again);
      await second.server.close();
    }
  }, 240_000);
});
