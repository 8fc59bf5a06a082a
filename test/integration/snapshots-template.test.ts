import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { SandboxManager } from '../../src/engine/sandbox-manager.js';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';
import { layerMarker, miniCatalog, miniTemplateLayer } from '../helpers/mini-template.js';

/**
 * Snapshots of sandboxes from a template: the whole root (its /workspace inside) is snapshotted,
 * a sandbox made from it has the same root back, and changes are measured against the template
 * layer or the snapshot. Real sandboxes on the real volume.
 */
let engine: SandboxManager;
let layer: string;
const TENANT = 't1';

beforeAll(async () => {
  layer = await miniTemplateLayer(new HostEnvironment({ dataDir: testDataDir() }).volume);
  engine = await SandboxManager.open({ dataDir: testDataDir(), templates: miniCatalog(layer) });
});
afterAll(async () => {
  await engine?.close();
});
afterEach(expectNoLeaks);

async function sh(sandboxId: string, line: string, user?: string): Promise<string> {
  const handle = await engine.startProcess(TENANT, sandboxId, { argv: ['/bin/sh', '-c', line], ...(user ? { user } : {}) });
  const result = await handle.result;
  expect(result.exitCode, `${line}: ${result.stderr}`).toBe(0);
  return result.stdout;
}

describe('snapshots of template sandboxes', () => {
  it('root and workspace come back in a sandbox made from the snapshot; changes are against the layer, then the snapshot', async () => {
    const source = await engine.create({ tenantId: TENANT, spec: { template: 'mini', ttlMs: 60_000 } });
    const made: string[] = [source.sandboxId];
    try {
      await sh(source.sandboxId, 'echo conf > /etc/added && echo w > /workspace/w', 'root');
      const sourceChanges = await engine.changes(TENANT, source.sandboxId);
      expect(sourceChanges.origin).toEqual({ template: 'mini:latest' });
      expect(sourceChanges.changes.filter((c) => c.kind !== 'modified' || c.type !== 'dir').map((c) => `${c.kind} ${c.path}`)).toEqual(['added /etc/added', 'added /workspace/w']);

      const snapshot = await engine.snapshot(TENANT, source.sandboxId);
      expect(snapshot).toMatchObject({ disk: 'root', template: 'mini:latest', sandboxId: source.sandboxId });
      const copy = await engine.create({ tenantId: TENANT, spec: { snapshot: snapshot.snapshotId } });
      made.push(copy.sandboxId);
      expect(copy.spec.template).toBe('mini:latest');
      expect(copy.spec.user).toBe('user');
      expect(await sh(copy.sandboxId, 'cat /etc/added /workspace/w /etc/template-marker; whoami')).toBe('conf\nw\nmini\nuser\n');
      expect((await engine.changes(TENANT, copy.sandboxId)).changes).toEqual([]);
      await sh(copy.sandboxId, 'echo r > /root/r && rm /etc/added', 'root');
      expect((await engine.changes(TENANT, copy.sandboxId)).changes.filter((c) => c.type !== 'dir').map((c) => `${c.kind} ${c.path}`)).toEqual(['deleted /etc/added', 'added /root/r']);
      // The template layer was never written.
      expect(await layerMarker(layer)).toBe('mini\n');

      for (const id of made) await engine.kill(TENANT, id);
      await engine.deleteSnapshot(TENANT, snapshot.snapshotId);
    } finally {
      for (const id of made) await engine.kill(TENANT, id).catch(() => undefined);
      for (const s of engine.listSnapshots(TENANT)) await engine.deleteSnapshot(TENANT, s.snapshotId);
    }
  }, 120_000);

  it('a listed snapshot whose data is gone is refused with SNAPSHOT_NOT_FOUND saying so, and nothing is made', async () => {
    // Start-up keeps records whose data is gone (with their lineage); a create from one must not
    // reach btrfs, and must leave no record. Both disks: a template's root and a bare workspace.
    const volume = new HostEnvironment({ dataDir: testDataDir() }).volume;
    for (const template of ['mini', 'host']) {
      const source = await engine.create({ tenantId: TENANT, spec: { template, ttlMs: 60_000 } });
      try {
        const snapshot = await engine.snapshot(TENANT, source.sandboxId);
        execFileSync('btrfs', ['subvolume', 'delete', join(volume.mountPoint, 'snapshots', snapshot.snapshotId, 'disk')]);
        const before = engine.list({ tenantId: TENANT }).length;
        const refused = await engine.create({ tenantId: TENANT, spec: { snapshot: snapshot.snapshotId } }).catch((error: unknown) => error);
        expect(refused).toMatchObject({ code: 'SNAPSHOT_NOT_FOUND', message: expect.stringContaining('its data is gone') as unknown });
        expect(engine.list({ tenantId: TENANT })).toHaveLength(before);
        // Its record can still be deleted.
        await engine.deleteSnapshot(TENANT, snapshot.snapshotId);
        expect(engine.listSnapshots(TENANT)).toEqual([]);
      } finally {
        await engine.kill(TENANT, source.sandboxId).catch(() => undefined);
        for (const s of engine.listSnapshots(TENANT)) await engine.deleteSnapshot(TENANT, s.snapshotId).catch(() => undefined);
      }
    }
  }, 120_000);
});

const gvisorReady = existsSync('/usr/local/bin/runsc') || existsSync('/usr/bin/runsc');

/** Polls `read` until it passes `than`; the deadline is reached only by a failure. */
async function above(read: () => Promise<number>, than: number): Promise<number> {
  const deadline = Date.now() + 30_000;
  for (;;) {
    const value = await read();
    if (value > than) return value;
    if (Date.now() > deadline) throw new Error(`stayed at ${value}, wanted more than ${than}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

describe('template sandboxes on gVisor', () => {
  it.skipIf(!gvisorReady)('mount volumes through the idmapped view (read-only honoured), and a full snapshot resumes the root and its processes in a new sandbox', async () => {
    const spec = { template: 'mini', backend: 'gvisor' as const, ttlMs: 120_000, limits: { wallClockMs: 120_000 } };
    await engine.createVolume(TENANT, { name: 'tv', sizeBytes: 16 * 1024 * 1024 });
    const made: string[] = [];
    try {
      const writer = await engine.create({ tenantId: TENANT, spec: { ...spec, volumes: [{ name: 'tv', path: '/data' }] } });
      made.push(writer.sandboxId);
      expect(await sh(writer.sandboxId, 'mkdir -p /data/open && echo w > /data/f && stat -c %U /data/f && whoami')).toBe('user\nuser\n');
      await engine.kill(TENANT, writer.sandboxId);
      const source = await engine.create({ tenantId: TENANT, spec: { ...spec, volumes: [{ name: 'tv', path: '/data', readOnly: true }] } });
      made.push(source.sandboxId);
      expect(await sh(source.sandboxId, 'cat /data/f')).toBe('w\n');
      // The reader is the owner of /data/open (the same user, through the idmapped view): only the read-only mount refuses.
      const refused = await (await engine.startProcess(TENANT, source.sandboxId, { argv: ['/bin/sh', '-c', 'echo x > /data/open/x'] })).result;
      expect(refused.exitCode).not.toBe(0);
      expect(refused.stderr).toMatch(/Read-only file system/);

      await sh(source.sandboxId, 'echo conf > /etc/added', 'root');
      // In the user's home on the root disk (the mini layer's /workspace is root's).
      await engine.startProcess(TENANT, source.sandboxId, { argv: ['/bin/sh', '-c', 'i=0; while :; do i=$((i+1)); echo $i > /home/user/n; sleep 0.05; done'], tag: 'count' });
      const count = async (id: string) => Number((await sh(id, 'cat /home/user/n 2>/dev/null || echo 0')).trim() || '0');
      const before = await above(() => count(source.sandboxId), 20);
      const snapshot = await engine.snapshot(TENANT, source.sandboxId, { mode: 'full' });
      expect(snapshot).toMatchObject({ mode: 'full', disk: 'root', template: 'mini:latest' });
      const copy = await engine.create({ tenantId: TENANT, spec: { snapshot: snapshot.snapshotId } });
      made.push(copy.sandboxId);
      expect(copy.spec).toMatchObject({ backend: 'gvisor', template: 'mini:latest', volumes: [{ name: 'tv', path: '/data', readOnly: true }] });
      // The count resumed from memory (a new process would start at 1) and goes on.
      const resumed = await count(copy.sandboxId);
      expect(resumed).toBeGreaterThanOrEqual(before);
      await above(() => count(copy.sandboxId), resumed + 5);
      expect(engine.listProcesses(TENANT, copy.sandboxId).find((p) => p.tag === 'count')?.running).toBe(true);
      expect(await sh(copy.sandboxId, 'cat /etc/added /data/f; whoami')).toBe('conf\nw\nuser\n');
      // The source goes on too.
      await above(() => count(source.sandboxId), before + 5);

      for (const id of made) await engine.kill(TENANT, id);
      await engine.deleteSnapshot(TENANT, snapshot.snapshotId);
      await engine.deleteVolume(TENANT, 'tv');
    } finally {
      for (const id of made) await engine.kill(TENANT, id).catch(() => undefined);
      for (const s of engine.listSnapshots(TENANT)) await engine.deleteSnapshot(TENANT, s.snapshotId);
      await engine.deleteVolume(TENANT, 'tv').catch(() => undefined);
    }
  }, 180_000);
});
