import { execFileSync, spawnSync } from 'node:child_process';
import { lstat, mkdir, readdir, readFile, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { pathExists } from '../../src/host/fs-util.js';
import { SpareClones } from '../../src/host/spare-clones.host.js';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';

/*
 * A ready clone of what sandboxes start from (a snapshot's disk, a template's layer): a create
 * takes it by a rename, which waits for no btrfs commit, and the next one is made behind it.
 * Real subvolumes on the test data dir's volume; capsule-launch takes a spare the same way.
 */
describe('SpareClones', () => {
  let host: HostEnvironment;
  let launcher: string;
  let source: string;
  const subvolumeId = (path: string) => execFileSync('btrfs', ['inspect-internal', 'rootid', path], { encoding: 'utf8' }).trim();

  beforeAll(async () => {
    host = new HostEnvironment({ dataDir: testDataDir() });
    launcher = (await host.ensure()).launcher;
    // A read-only source, as a snapshot's disk is.
    const writable = host.volume.path('sparesrcw');
    execFileSync('btrfs', ['subvolume', 'create', writable]);
    await mkdir(join(writable, 'dir'));
    await writeFile(join(writable, 'dir', 'file.txt'), 'kept\n');
    execFileSync('chown', ['-R', '5151:5151', writable]);
    source = join(host.volume.mountPoint, 'snapshots', 'spare-test-source');
    await mkdir(join(host.volume.mountPoint, 'snapshots'), { recursive: true });
    execFileSync('btrfs', ['subvolume', 'snapshot', '-r', writable, source]);
    await host.volume.delete('sparesrcw');
  });
  afterAll(async () => {
    await host.volume.spares.clear();
    for (const id of ['sparea', 'spareb', 'sparec', 'spared']) await host.volume.delete(id);
    for (const extra of [`${source}-2`, `${source}-3`]) if (await pathExists(extra)) execFileSync('btrfs', ['subvolume', 'delete', extra]);
    execFileSync('btrfs', ['subvolume', 'delete', source]);
    execFileSync('rmdir', [join(host.volume.mountPoint, 'snapshots')]);
    await expectNoLeaks();
  });

  it('keeps one ready for a kept source: a take renames it into place and the next one is made', async () => {
    const spares = host.volume.spares;
    expect(await spares.take(source, host.volume.path('sparea'))).toBe(false); // none kept yet
    spares.keep(source);
    await spares.idle();
    const spare = spares.pathOf(source);
    const spareId = subvolumeId(spare);
    expect(await spares.take(source, host.volume.path('sparea'))).toBe(true);
    // The same subvolume, now the sandbox's, with the source's files; the spare's place is empty.
    expect(subvolumeId(host.volume.path('sparea'))).toBe(spareId);
    expect(await readFile(join(host.volume.path('sparea'), 'dir', 'file.txt'), 'utf8')).toBe('kept\n');
    expect(await pathExists(spare)).toBe(false);
    spares.replenish(source);
    await spares.idle();
    expect(await pathExists(spare)).toBe(true);
    expect(subvolumeId(spare)).not.toBe(spareId);
  });

  it("a layer's spare is readied as a root before a create takes it: mode 0755, the template user's /workspace, the tools' mount point, the source untouched", async () => {
    const volume = host.volume;
    await volume.spares.discard(source); // the spare an earlier test left was made unreadied
    volume.keepLayerSpare(source);
    await volume.spares.idle();
    const spare = volume.spares.pathOf(source);
    // Readied before it is offered: a create writes nothing to it first.
    expect((await stat(spare)).mode & 0o7777).toBe(0o755);
    expect(await stat(join(spare, 'workspace'))).toMatchObject({ uid: 1000, gid: 1000 });
    // The tools' mount point too: bwrap making it in the sandbox's root would wait for a commit.
    expect((await lstat(join(spare, '.capsule'))).isDirectory()).toBe(true);
    const { root, workspace } = await volume.createRoot('spared', source);
    expect(subvolumeId(root)).not.toBe(subvolumeId(source));
    expect(await stat(workspace)).toMatchObject({ uid: 1000 });
    expect(await readFile(join(root, 'dir', 'file.txt'), 'utf8')).toBe('kept\n');
    expect(await pathExists(join(source, 'workspace'))).toBe(false);
    await volume.spares.discard(source);
    await volume.delete('spared');
  });

  it('a layer keeps two spares: a create right behind another takes the second, and both come back on replenish', async () => {
    const volume = host.volume;
    volume.keepLayerSpare(source);
    await volume.spares.idle();
    const slots = async () => (await readdir(join(volume.mountPoint, 'spares'))).filter((name) => !name.endsWith('.making')).length;
    expect(await slots()).toBe(2);
    const spareIds = [volume.spares.pathOf(source), `${volume.spares.pathOf(source)}-2`].map(subvolumeId);
    // Two creates, neither replenishing (a namespace create replenishes after its first command):
    // each takes a spare, none snapshots the layer for itself.
    const first = await volume.createRoot('sparea', source, { replenishLater: true });
    const second = await volume.createRoot('spareb', source, { replenishLater: true });
    expect(await slots()).toBe(0);
    expect([subvolumeId(first.root), subvolumeId(second.root)].sort()).toEqual([...spareIds].sort());
    volume.spares.replenish(source);
    await volume.spares.idle();
    expect(await slots()).toBe(2);
    await volume.spares.discard(source);
    expect(await slots()).toBe(0);
    for (const id of ['sparea', 'spareb']) await volume.delete(id);
  });

  it('capsule-launch takes the spare when there is one and snapshots the source when there is none', async () => {
    const spare = host.volume.spares.pathOf(source);
    host.volume.spares.keep(source);
    await host.volume.spares.idle();
    const spareId = subvolumeId(spare);
    for (const id of ['spareb', 'sparec']) {
      const path = host.volume.path(id);
      const made = spawnSync(launcher, ['--subvolume', `4242:0:${path}`, '--subvolume-from', source, '--subvolume-spare', spare, '--', '/bin/true'], { encoding: 'utf8', timeout: 10_000 });
      expect(made.status, made.stderr).toBe(0);
      const file = await stat(join(path, 'dir', 'file.txt'));
      expect({ uid: file.uid, mode: (await stat(path)).mode & 0o7777 }).toEqual({ uid: 4242, mode: 0o700 });
    }
    // The first took the spare; the second found none and made its own snapshot.
    expect(subvolumeId(host.volume.path('spareb'))).toBe(spareId);
    expect(subvolumeId(host.volume.path('sparec'))).not.toBe(spareId);
    expect(await pathExists(spare)).toBe(false);
  });

  it('makes none again once its source is discarded, and clear removes what a crashed process left', async () => {
    const spares = host.volume.spares;
    spares.keep(source);
    await spares.discard(source);
    expect(await pathExists(spares.pathOf(source))).toBe(false);
    spares.replenish(source);
    await spares.idle();
    expect(await pathExists(spares.pathOf(source))).toBe(false);
    // A half-made one of another process: a subvolume under a name no take ever finds.
    const partial = `${spares.pathOf(source)}.0badcafe.making`;
    execFileSync('btrfs', ['subvolume', 'snapshot', source, partial]);
    await spares.clear();
    expect(await readdir(join(host.volume.mountPoint, 'spares'))).toEqual([]);
  });

  it('keeps spares for at most maxSpares sources, the most recently created from; a create from a dropped one brings it back', async () => {
    const [a, b, c] = [source, `${source}-2`, `${source}-3`];
    for (const extra of [b, c]) execFileSync('btrfs', ['subvolume', 'snapshot', '-r', source, extra]);
    const deleted: string[] = [];
    const spares = new SpareClones(
      host.volume.mountPoint,
      (paths) => {
        for (const path of paths) execFileSync('btrfs', ['subvolume', 'delete', path]);
        deleted.push(...paths);
        return Promise.resolve();
      },
      2,
    );
    const ready = async () => {
      await spares.idle();
      return Promise.all([a, b, c].map((s) => pathExists(spares.pathOf(s))));
    };
    spares.keep(a);
    spares.keep(b);
    expect(await ready()).toEqual([true, true, false]);
    // A create from a, as capsule-launch makes it (it takes the spare; the host replenishes): a is
    // now the most recent, so a third kept source drops b's spare, not a's.
    expect(await spares.take(a, host.volume.path('spared'))).toBe(true);
    spares.replenish(a);
    spares.keep(c);
    expect(await ready()).toEqual([true, false, true]);
    expect(spares.keptCount).toBe(2);
    expect(deleted).toEqual([spares.pathOf(b)]);
    // A create from b snapshots it (no spare) and brings it back; a is now the oldest and goes.
    await host.volume.delete('spared');
    await spares.clone(b, host.volume.path('spared'));
    expect(await readFile(join(host.volume.path('spared'), 'dir', 'file.txt'), 'utf8')).toBe('kept\n');
    expect(await ready()).toEqual([false, true, true]);
    expect(spares.keptCount).toBe(2);
    await spares.clear();
    expect(await ready()).toEqual([false, false, false]);
  });
});
