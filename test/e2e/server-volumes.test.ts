import { chownSync, existsSync, mkdtempSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { AlreadyExistsError, ConflictError, NotFoundError, Sandbox, Snapshots, Volumes, type ConnectionOptions } from '../../src/sdk/index.js';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';
import { startTestServer, type TestServer } from './server-helpers.js';

/** Named volumes over /v1 and the SDK: per tenant, quota'd, mounted into real sandboxes, outliving them and the server. */
afterEach(expectNoLeaks);

const host = new HostEnvironment({ dataDir: testDataDir() });
const MiB = 1024 * 1024;
const gvisorReady = existsSync('/usr/local/bin/runsc') || existsSync('/usr/bin/runsc');

async function sh(sandbox: Sandbox, line: string): Promise<{ exitCode: number | null; stdout: string; stderr: string }> {
  const result = await sandbox.commands.run(['/bin/sh', '-c', line]);
  return { exitCode: result.exitCode, stdout: result.stdout, stderr: result.stderr };
}

async function mintTenant(t: TestServer, tenantId: string): Promise<ConnectionOptions> {
  const minted = await t.json<{ apiKey: string }>('POST', '/v1/keys', { body: { tenantId } });
  expect(minted.status, JSON.stringify(minted.body)).toBe(201);
  return { url: t.url, apiKey: minted.body.apiKey };
}

async function cleanUp(conn: ConnectionOptions): Promise<void> {
  for await (const info of Sandbox.listAll({ ...conn, state: ['running', 'paused', 'starting'] })) await (await Sandbox.connect(info.sandboxId, conn)).kill();
  for (const volume of await Volumes.list(conn)) await Volumes.delete(volume.name, conn);
}

describe('volumes', () => {
  it('a volume keeps its files after its sandbox ends and across a server restart', async () => {
    const dbDir = mkdtempSync(join(testDataDir(), 'server-db-'));
    const first = await startTestServer({ databaseDir: dbDir });
    const conn = { url: first.url, apiKey: first.apiKey };
    let volumeId: string;
    try {
      const volume = await Volumes.create('data', 64 * MiB, conn);
      volumeId = volume.volumeId;
      expect(volume).toMatchObject({ name: 'data', sizeBytes: 64 * MiB, shared: false, tenantId: 'default' });
      const writer = await Sandbox.create({ ttlMs: 60_000, volumes: [{ name: 'data', path: '/data' }] }, conn);
      expect(await sh(writer, 'mkdir -p /data/run1 && echo result-1 > /data/run1/out && cat /data/run1/out')).toMatchObject({ exitCode: 0, stdout: 'result-1\n' });
      await writer.kill();
      // Written by a sandbox that has ended, still there for the next one.
      const reader = await Sandbox.create({ ttlMs: 60_000, volumes: [{ name: 'data', path: '/data', readOnly: true }] }, conn);
      expect(await sh(reader, 'cat /data/run1/out')).toMatchObject({ exitCode: 0, stdout: 'result-1\n' });
      const refused = await sh(reader, 'echo x > /data/run1/other');
      expect(refused.exitCode).not.toBe(0);
      expect(refused.stderr).toMatch(/Read-only file system/);
      await reader.kill();
      expect((await Volumes.get('data', conn)).usedBytes).toBeGreaterThan(0);
    } catch (error) {
      await cleanUp(conn);
      throw error;
    } finally {
      await first.server.close();
    }
    // As a host-template sandbox that did not come back leaves it: lent to that sandbox's uid.
    const volumeDir = join(host.volume.mountPoint, 'volumes', volumeId);
    chownSync(volumeDir, 3_000_123, 3_000_123);
    const second = await startTestServer({ databaseDir: dbDir, env: { CAPSULE_API_KEY: first.apiKey } });
    const again = { url: second.url, apiKey: first.apiKey };
    try {
      // Nobody holds it after the restart: it is the stored user's again.
      expect(statSync(volumeDir).uid).toBe(1000);
      expect((await Volumes.list(again)).map((v) => v.volumeId)).toEqual([volumeId]);
      const after = await Sandbox.create({ ttlMs: 60_000, volumes: [{ name: 'data', path: '/data' }] }, again);
      expect(await sh(after, 'cat /data/run1/out && echo more >> /data/run1/out')).toMatchObject({ exitCode: 0, stdout: 'result-1\n' });
      // Mounted: deleting it is refused until the sandbox ends.
      expect(await Volumes.delete('data', again).catch((error: unknown) => error)).toBeInstanceOf(ConflictError);
      await after.kill();
      await Volumes.delete('data', again);
      expect(existsSync(join(host.volume.mountPoint, 'volumes', volumeId))).toBe(false);
    } finally {
      await cleanUp(again);
      await second.server.close();
    }
  }, 120_000);

  it('its size limit holds, one writer at a time, names unique per tenant', async () => {
    const t = await startTestServer();
    const conn = { url: t.url, apiKey: t.apiKey };
    try {
      await Volumes.create('small', 8 * MiB, conn);
      expect(await Volumes.create('small', 8 * MiB, conn).catch((error: unknown) => error)).toBeInstanceOf(AlreadyExistsError);
      const writer = await Sandbox.create({ ttlMs: 60_000, volumes: [{ name: 'small', path: '/data' }] }, conn);
      const full = await sh(writer, 'dd if=/dev/zero of=/data/big bs=1M count=32 2>&1; sync');
      expect(full.stdout).toMatch(/Disk quota exceeded|No space left/);
      expect((await Volumes.get('small', conn)).usedBytes).toBeLessThanOrEqual(9 * MiB);

      const second = await t.json<{ code: string; details: { sandboxId: string } }>('POST', '/v1/sandboxes', { body: { spec: { volumes: [{ name: 'small', path: '/data' }] } } });
      expect(second.status).toBe(409);
      expect(second.body.code).toBe('CONFLICT');
      expect(second.body.details.sandboxId).toBe(writer.sandboxId);
      const reader = await Sandbox.create({ ttlMs: 60_000, volumes: [{ name: 'small', path: '/data', readOnly: true }] }, conn);
      expect((await sh(reader, 'ls /data')).exitCode).toBe(0);

      // Shared, it still takes one writer of the host template at a time (each has its own uid).
      await Volumes.create('team', 8 * MiB, { ...conn, shared: true });
      const a = await Sandbox.create({ ttlMs: 60_000, volumes: [{ name: 'team', path: '/team' }] }, conn);
      expect((await sh(a, 'echo from-a > /team/a')).exitCode).toBe(0);
      const b = await t.json<{ code: string; hint: string }>('POST', '/v1/sandboxes', { body: { spec: { volumes: [{ name: 'team', path: '/team' }] } } });
      expect(b.status).toBe(409);
      expect(b.body.hint).toContain('template');
      const c = await Sandbox.create({ ttlMs: 60_000, volumes: [{ name: 'team', path: '/team', readOnly: true }] }, conn);
      expect(await sh(c, 'cat /team/a')).toMatchObject({ exitCode: 0, stdout: 'from-a\n' });
    } finally {
      await cleanUp(conn);
      await t.server.close();
    }
  }, 120_000);

  it('another tenant can neither see, mount nor delete a volume', async () => {
    const t = await startTestServer();
    const alice = await mintTenant(t, 'alice');
    const bob = await mintTenant(t, 'bob');
    try {
      await Volumes.create('private', 16 * MiB, alice);
      expect(await Volumes.list(bob)).toEqual([]);
      expect(await Volumes.get('private', bob).catch((error: unknown) => error)).toBeInstanceOf(NotFoundError);
      const mount = await t.json<{ code: string }>('POST', '/v1/sandboxes', { key: bob.apiKey, body: { spec: { volumes: [{ name: 'private', path: '/data' }] } } });
      expect(mount.status).toBe(404);
      expect(mount.body.code).toBe('VOLUME_NOT_FOUND');
      expect(await Volumes.delete('private', bob).catch((error: unknown) => error)).toBeInstanceOf(NotFoundError);
      // Bob's own volume of the same name is his, apart from Alice's.
      await Volumes.create('private', 16 * MiB, bob);
      const sandbox = await Sandbox.create({ ttlMs: 60_000, volumes: [{ name: 'private', path: '/data' }] }, alice);
      expect((await sh(sandbox, 'echo alice > /data/who')).exitCode).toBe(0);
      const bobs = await Sandbox.create({ ttlMs: 60_000, volumes: [{ name: 'private', path: '/data' }] }, bob);
      expect((await sh(bobs, 'ls -A /data')).stdout).toBe('');
    } finally {
      await cleanUp(alice);
      await cleanUp(bob);
      await t.server.close();
    }
  }, 120_000);

  for (const backend of ['namespace', 'gvisor'] as const) {
    it.skipIf(backend === 'gvisor' && !gvisorReady)(`${backend}: a copy from a sandbox's disk into a volume is counted by the volume's limit (copy_file_range, which reflinks on btrfs, never reaches the host's)`, async () => {
      const t = await startTestServer();
      const conn = await mintTenant(t, `vol-reflink-${backend}`);
      try {
        await Volumes.create('small', 16 * MiB, conn);
        const sandbox = await Sandbox.create({ backend, ttlMs: 60_000, limits: { diskBytes: 64 * MiB }, volumes: [{ name: 'small', path: '/data' }] }, conn);
        expect((await sh(sandbox, 'head -c 12M /dev/urandom > /workspace/f && sync')).exitCode).toBe(0);
        if (backend === 'namespace') {
          // Refused by seccomp; gVisor's own kernel implements the call.
          const direct = await sh(sandbox, `python3 -c "import os; a = os.open('/workspace/f', os.O_RDONLY); b = os.open('/data/x', os.O_WRONLY | os.O_CREAT); os.copy_file_range(a, b, 4096)"`);
          expect(direct.exitCode).not.toBe(0);
          expect(direct.stderr).toMatch(/Function not implemented/);
        }
        // The first copy fits; the second passes the volume's 16 MiB.
        expect((await sh(sandbox, 'rm -f /data/x; cp /workspace/f /data/f1 && sync')).exitCode).toBe(0);
        const second = await sh(sandbox, 'cp /workspace/f /data/f2 && sync');
        expect(second.exitCode).not.toBe(0);
        expect(second.stderr).toMatch(/Disk quota exceeded|No space left/);
      } finally {
        await cleanUp(conn);
        await t.server.close();
      }
    }, 120_000);
  }

  it('a snapshot keeps a copy of its volumes only when asked; a volume made from the copy has the files of that instant, outlives the snapshot, and holds at most its size', async () => {
    const t = await startTestServer();
    const alice = await mintTenant(t, 'vol-copy-alice');
    const bob = await mintTenant(t, 'vol-copy-bob');
    const snapshots: string[] = [];
    try {
      await Volumes.create('data', 32 * MiB, alice);
      // Mounted twice (writable and read-only): copied once, charged once.
      const source = await Sandbox.create({ ttlMs: 60_000, volumes: [{ name: 'data', path: '/data' }, { name: 'data', path: '/ro', readOnly: true }] }, alice);
      expect((await sh(source, 'echo then > /data/a && head -c 8M /dev/urandom > /data/big && sync')).exitCode).toBe(0);
      const plain = await source.snapshot();
      snapshots.push(plain.snapshotId);
      expect(plain.volumes).toEqual([
        expect.objectContaining({ name: 'data', path: '/data', readOnly: false, included: false, sizeBytes: 32 * MiB }),
        expect.objectContaining({ name: 'data', path: '/ro', readOnly: true, included: false }),
      ]);
      const kept = await source.snapshot({ includeVolumes: true });
      snapshots.push(kept.snapshotId);
      expect(kept.volumes).toEqual([expect.objectContaining({ name: 'data', path: '/data', included: true, sizeBytes: 32 * MiB }), expect.objectContaining({ name: 'data', path: '/ro', included: true })]);
      const copyBytes = kept.volumes![0]!.usedBytes!;
      expect(kept.volumes![1]!.usedBytes).toBe(copyBytes);
      expect(copyBytes).toBeGreaterThanOrEqual(8 * MiB);
      // The copy is charged with the snapshot, once.
      expect(kept.chargedBytes! - plain.chargedBytes!).toBeGreaterThanOrEqual(8 * MiB);
      expect(kept.chargedBytes! - plain.chargedBytes!).toBeLessThan(2 * copyBytes);
      // Written after the snapshot: not in the copy.
      expect((await sh(source, 'echo now > /data/a')).exitCode).toBe(0);

      const none = await Volumes.createFrom('data-then', { snapshotId: plain.snapshotId, volume: 'data' }, alice).catch((error: unknown) => error);
      expect(none).toBeInstanceOf(NotFoundError);
      expect(none).toMatchObject({ code: 'VOLUME_NOT_FOUND' });
      expect((none as Error & { hint?: string }).hint).toMatch(/includeVolumes/);
      const small = await Volumes.createFrom('data-then', { snapshotId: kept.snapshotId, volume: 'data' }, { ...alice, sizeBytes: 4 * MiB }).catch((error: unknown) => error);
      expect(small).toMatchObject({ code: 'INVALID_ARGUMENT' });
      // Another tenant cannot copy from it: the snapshot is not there for it.
      expect(await Volumes.createFrom('stolen', { snapshotId: kept.snapshotId, volume: 'data' }, bob).catch((error: unknown) => error)).toMatchObject({ code: 'SNAPSHOT_NOT_FOUND' });
      expect(await Volumes.list(bob)).toEqual([]);

      const copy = await Volumes.createFrom('data-then', { snapshotId: kept.snapshotId, volume: 'data' }, alice);
      expect(copy).toMatchObject({ name: 'data-then', sizeBytes: 32 * MiB, origin: { snapshotId: kept.snapshotId, volume: 'data', bytes: copyBytes } });
      await source.kill();
      // The volume is its own: the snapshots go, its files stay.
      for (const id of snapshots.splice(0)) await Snapshots.delete(id, alice);
      const reader = await Sandbox.create({ ttlMs: 60_000, volumes: [{ name: 'data-then', path: '/v' }] }, alice);
      expect(await sh(reader, 'cat /v/a && wc -c < /v/big')).toMatchObject({ exitCode: 0, stdout: `then\n${8 * MiB}\n` });
      // It holds at most its size: the 8 MiB it came with and 24 more at most.
      const filled = await sh(reader, 'head -c 40M /dev/zero > /v/fill; echo exit=$?; sync');
      expect(filled.stdout).toMatch(/exit=[1-9]/);
      expect(filled.stderr).toMatch(/Disk quota exceeded|No space left/);
      expect((await Volumes.get('data-then', alice)).usedBytes).toBeLessThanOrEqual(32 * MiB);
      // And the original went on with its own files.
      const original = await Sandbox.create({ ttlMs: 60_000, volumes: [{ name: 'data', path: '/data', readOnly: true }] }, alice);
      expect(await sh(original, 'cat /data/a')).toMatchObject({ exitCode: 0, stdout: 'now\n' });
    } finally {
      await cleanUp(alice);
      for (const id of snapshots) await Snapshots.delete(id, alice).catch(() => undefined);
      await cleanUp(bob);
      await t.server.close();
    }
  }, 180_000);

  it.skipIf(!gvisorReady)('gVisor mounts volumes read-write and read-only, with the size limit, and both backends share one', async () => {
    const t = await startTestServer();
    const conn = { url: t.url, apiKey: t.apiKey };
    try {
      await Volumes.create('v', 8 * MiB, conn);
      const writer = await Sandbox.create({ backend: 'gvisor', ttlMs: 60_000, volumes: [{ name: 'v', path: '/data' }] }, conn);
      expect(await sh(writer, 'mkdir -p /data/d /data/open && chmod 777 /data/open && echo from-gvisor > /data/d/f && stat -c %u /data/d/f && id -u')).toMatchObject({ exitCode: 0, stdout: '1000\n1000\n' });
      const full = await sh(writer, 'dd if=/dev/zero of=/data/big bs=1M count=32 2>&1; rm -f /data/big');
      expect(full.stdout).toMatch(/Disk quota exceeded|No space left/);
      // One writer: a second gVisor sandbox may read it only.
      const second = await t.json<{ code: string }>('POST', '/v1/sandboxes', { body: { spec: { backend: 'gvisor', volumes: [{ name: 'v', path: '/data' }] } } });
      expect(second.status).toBe(409);
      const reader = await Sandbox.create({ backend: 'gvisor', ttlMs: 60_000, volumes: [{ name: 'v', path: '/data', readOnly: true }] }, conn);
      expect(await sh(reader, 'cat /data/d/f')).toMatchObject({ exitCode: 0, stdout: 'from-gvisor\n' });
      // A directory anyone may write to: only the read-only mount refuses the write.
      const refused = await sh(reader, 'echo x > /data/open/other');
      expect(refused.exitCode).not.toBe(0);
      expect(refused.stderr).toMatch(/Read-only file system/);
      await reader.kill();
      await writer.kill();
      // What gVisor wrote, a namespace sandbox reads and writes (and the other way round).
      const ns = await Sandbox.create({ ttlMs: 60_000, volumes: [{ name: 'v', path: '/data' }] }, conn);
      expect(await sh(ns, 'cat /data/d/f && echo from-namespace >> /data/d/f')).toMatchObject({ exitCode: 0, stdout: 'from-gvisor\n' });
      await ns.kill();
      const again = await Sandbox.create({ backend: 'gvisor', ttlMs: 60_000, volumes: [{ name: 'v', path: '/data' }] }, conn);
      expect(await sh(again, 'cat /data/d/f && rm /data/d/f && ls -A /data/d /data/open')).toMatchObject({ exitCode: 0, stdout: 'from-gvisor\nfrom-namespace\n/data/d:\n\n/data/open:\n' });
    } finally {
      await cleanUp(conn);
      await t.server.close();
    }
  }, 180_000);
});
