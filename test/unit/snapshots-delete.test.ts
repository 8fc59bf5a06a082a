import { describe, expect, it } from 'vitest';
import type { DiskBudget } from '../../src/engine/disk-budget.js';
import { Snapshots } from '../../src/engine/snapshots.js';
import type { StoredDisks } from '../../src/host/stored-disks.host.js';
import type { WorkspaceVolume } from '../../src/host/volume.host.js';
import { parseSpec } from '../../src/sandbox-spec/index.js';
import { MemorySnapshotRecords } from '../../src/store/snapshot-records.js';
import type { SnapshotInfo } from '../../src/wire/index.js';

/*
 * The bookkeeping around a snapshot's delete, with its disk held open by the test so that calls
 * really overlap: two deletes at once delete the data and give the bytes back once; a snapshot a
 * sandbox is being made from is not deleted under it; one being deleted is not made from.
 */
function setUp() {
  let finish!: () => void;
  const deletes: string[] = [];
  const released: number[] = [];
  const store = new MemorySnapshotRecords();
  const budget = { reserveStored: () => undefined, releaseStored: (_o: unknown, _r: unknown, bytes: number) => released.push(bytes), restoreStored: () => undefined } as unknown as DiskBudget;
  const snapshots = new Snapshots({} as WorkspaceVolume, store, () => 0, budget);
  const disks = {
    deleteSnapshot: async (id: string) => {
      deletes.push(id);
      await new Promise<void>((resolve) => (finish = resolve));
    },
  } as unknown as StoredDisks;
  (snapshots as unknown as { disks: StoredDisks }).disks = disks;
  const record: SnapshotInfo = {
    snapshotId: 'snap_aaaaaaaaaaaaaaaaaaaa', tenantId: 'tenant-a', mode: 'filesystem', sandboxId: 'sbx', template: 'host', backend: 'namespace',
    disk: 'workspace', chargedBytes: 64, createdAt: new Date(0).toISOString(), spec: parseSpec({}),
  };
  store.upsert(record);
  return { snapshots, deletes, released, record, finish: () => finish() };
}

describe('Snapshots.delete', () => {
  it('joins a delete already running: one disk delete, one release; a create from it meanwhile is a CONFLICT', async () => {
    const { snapshots, deletes, released, record, finish } = setUp();
    const first = snapshots.delete('tenant-a', record.snapshotId, []);
    const second = snapshots.delete('tenant-a', record.snapshotId, []);
    await expect.poll(() => deletes.length).toBe(1);
    expect(() => snapshots.hold('tenant-a', record.snapshotId)).toThrow(expect.objectContaining({ code: 'CONFLICT' }));
    finish();
    await Promise.all([first, second]);
    expect(deletes).toHaveLength(1);
    expect(released).toEqual([64]);
    await expect(snapshots.delete('tenant-a', record.snapshotId, [])).rejects.toMatchObject({ code: 'SNAPSHOT_NOT_FOUND' });
  });

  it('refuses to delete a snapshot a sandbox is being made from, until that create lets go of it', async () => {
    const { snapshots, deletes, record, finish } = setUp();
    const held = snapshots.hold('tenant-a', record.snapshotId);
    const other = snapshots.hold('tenant-a', record.snapshotId);
    expect(held.info.snapshotId).toBe(record.snapshotId);
    await expect(snapshots.delete('tenant-a', record.snapshotId, [])).rejects.toMatchObject({ code: 'CONFLICT' });
    held.release();
    held.release(); // once only
    await expect(snapshots.delete('tenant-a', record.snapshotId, [])).rejects.toMatchObject({ code: 'CONFLICT' });
    other.release();
    const deleting = snapshots.delete('tenant-a', record.snapshotId, []);
    await expect.poll(() => deletes.length).toBe(1);
    finish();
    await deleting;
  });
});
