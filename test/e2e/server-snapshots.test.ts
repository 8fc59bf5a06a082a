import { existsSync, mkdtempSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { HostEnvironment } from '../../src/host/host-env.host.js';
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

  it('the namespace backend refuses mode full with a stable code and a hint', async () => {
    const t = await startTestServer();
    const conn = { url: t.url, apiKey: t.apiKey };
    try {
      const source = await Sandbox.create({ ttlMs: 60_000 }, conn);
      const refused = await t.json<{ code: string; hint: string }>('POST', `/v1/sandboxes/${source.sandboxId}/snapshots`, { body: { mode: 'full' } });
      expect(refused.status).toBe(422);
      expect(refused.body.code).toBe('BACKEND_CANNOT_ENFORCE');
      expect(refused.body.hint).toContain('filesystem');
      expect(await Snapshots.list(conn)).toEqual([]);
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
