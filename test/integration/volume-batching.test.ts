import { execFileSync } from 'node:child_process';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';

/*
 * A busy server asks the workspace volume for many usages and deletes at once. The subvolume ids
 * behind the usages are learnt from one `btrfs subvolume list` that callers join, and deletes
 * asked together run as one `btrfs subvolume delete`; each caller still gets its own answer.
 * Real subvolumes on the real volume (the test data dir's).
 */
const MiB = 1024 * 1024;

describe('WorkspaceVolume batching', () => {
  let host: HostEnvironment;
  const ids = Array.from({ length: 6 }, (_, i) => `volbatch${i}`);

  beforeAll(async () => {
    host = new HostEnvironment({ dataDir: testDataDir() });
    await host.ensure();
  });
  afterAll(async () => {
    for (const id of [...ids, 'volbatchnested']) await host.volume.delete(id).catch(() => undefined);
    await expectNoLeaks();
  });

  it("reads every workspace's usage, also one made while a listing ran, and its own bytes", async () => {
    for (const id of ids.slice(0, 4)) await host.volume.createWithoutLimit(id, 4242);
    await writeFile(join(host.volume.path(ids[0]!), 'data'), Buffer.alloc(3 * MiB, 1));
    execFileSync('sync');
    const first = Promise.all(ids.slice(0, 4).map((id) => host.volume.usedBytes(id)));
    // Made while the first usages are being answered: it is seen by the listing it joins.
    const late = host.volume.createWithoutLimit(ids[4]!, 4242).then(() => host.volume.usedBytes(ids[4]!));
    const [usages, lateUsage] = await Promise.all([first, late]);
    for (const used of usages) expect(used).toBeTypeOf('number');
    expect(usages[0]).toBeGreaterThanOrEqual(3 * MiB);
    expect(usages[1]).toBeLessThan(MiB);
    expect(lateUsage).toBeTypeOf('number');
    // Nothing there, nothing read.
    expect(await host.volume.usedBytes(ids[5]!)).toBeUndefined();
  });

  it('deletes workspaces asked together, and a delete that fails fails only its own caller', async () => {
    await host.volume.createWithoutLimit(ids[5]!, 4242);
    // A subvolume holding another cannot be deleted: its delete fails, the others' do not.
    await host.volume.createWithoutLimit('volbatchnested', 4242);
    execFileSync('btrfs', ['subvolume', 'create', join(host.volume.path('volbatchnested'), 'inner')]);
    const results = await Promise.allSettled(['volbatchnested', ...ids].map((id) => host.volume.delete(id)));
    expect(results[0]?.status).toBe('rejected');
    expect(results.slice(1).map((result) => result.status)).toEqual(ids.map(() => 'fulfilled'));
    expect((await host.volume.list()).filter((id) => ids.includes(id))).toEqual([]);
    for (const id of ids) expect(await host.volume.usedBytes(id)).toBeUndefined();
    execFileSync('btrfs', ['subvolume', 'delete', join(host.volume.path('volbatchnested'), 'inner')]);
    await host.volume.delete('volbatchnested');
  });
});
