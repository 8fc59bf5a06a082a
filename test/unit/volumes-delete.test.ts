import { describe, expect, it } from 'vitest';
import type { StoredDisks } from '../../src/host/stored-disks.host.js';
import type { DiskBudget } from '../../src/engine/disk-budget.js';
import { Volumes } from '../../src/engine/volumes.js';
import { MemoryVolumeRecords } from '../../src/store/volume-records.js';
import { parseSpec } from '../../src/sandbox-spec/index.js';

/*
 * Two deletes of one volume at once (two requests, a client's retry): the data goes once and its
 * size comes back to the tenant's quota once; a sandbox that would mount it meanwhile is refused.
 * The disk here is held open by the test so that the two deletes really overlap.
 */
describe('Volumes.delete', () => {
  it('joins a delete already running: one disk delete, one release; a mount meanwhile is a CONFLICT', async () => {
    let finish!: () => void;
    const deletes: string[] = [];
    const disks = {
      createVolume: () => Promise.resolve('/unused'),
      deleteVolume: async (volumeId: string) => {
        deletes.push(volumeId);
        await new Promise<void>((resolve) => (finish = resolve));
      },
      volumePath: (volumeId: string) => `/volumes/${volumeId}`,
    } as unknown as StoredDisks;
    const released: number[] = [];
    const budget = {
      reserveStored: () => undefined,
      releaseStored: (_owner: unknown, _resource: unknown, bytes: number) => released.push(bytes),
      restoreStored: () => undefined,
    } as unknown as DiskBudget;
    const volumes = new Volumes(disks, new MemoryVolumeRecords(), () => 0, budget);
    await volumes.create('tenant-a', { name: 'data', sizeBytes: 64 });

    const first = volumes.delete('tenant-a', 'data', []);
    const second = volumes.delete('tenant-a', 'data', []);
    await expect.poll(() => deletes.length).toBe(1);
    const spec = parseSpec({ volumes: [{ name: 'data', path: '/data' }] });
    expect(() => volumes.resolve('tenant-a', spec, [])).toThrow(expect.objectContaining({ code: 'CONFLICT', message: 'volume data is being deleted' }));
    finish();
    await Promise.all([first, second]);
    expect(deletes).toHaveLength(1);
    expect(released).toEqual([64]);
    // Done: the next delete finds nothing.
    await expect(volumes.delete('tenant-a', 'data', [])).rejects.toMatchObject({ code: 'VOLUME_NOT_FOUND' });
  });
});
