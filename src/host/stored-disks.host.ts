import { chmod, chown, mkdir, readdir, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { runCommand } from './run-command.host.js';
import { pathExists } from './fs-util.js';
import { subvolumeId, type QuotaAccounting, type WorkspaceVolume } from './volume.host.js';

/** The user every template and volume stores its files as (raw ids, seen through idmapped mounts). */
export const STORED_USER_ID = 1000;
/** The host uids a host-template sandbox runs as (namespace 3,000,000+, gVisor 4,000,000+): a volume owned by one is lent. */
const LENT_UID_FIRST = 3_000_000;
const LENT_UID_LAST = 4_999_999;

/**
 * Disks that outlive sandboxes, on the same btrfs volume as their workspaces and roots (so every
 * copy is a copy-on-write snapshot that costs milliseconds):
 *
 *   snapshots/<snapshotId>/disk              read-only: a sandbox's root (or bare workspace)
 *   snapshots/<snapshotId>/checkpoint/       mode full: the backend's image of processes and memory
 *   snapshots/<snapshotId>/contexts.json     mode full: the interpreter contexts in that image
 *   snapshots/<snapshotId>/volumes/<volId>   read-only: volumes the snapshot included (includeVolumes)
 *   volumes/<volumeId>                       a named volume, bounded by its own quota group
 *   scratch/<random>                         read-only views of live disks while they are compared
 *
 * Sandbox disks (`ws-<id>`, `sb-<id>`) stay at the top, where WorkspaceVolume keeps them.
 */
export class StoredDisks {
  constructor(private readonly volume: WorkspaceVolume) {}

  private at(...parts: string[]): string {
    return join(this.volume.mountPoint, ...parts);
  }

  // ---- snapshots

  snapshotDir(snapshotId: string): string {
    return this.at('snapshots', snapshotId);
  }

  /** The read-only copy of the sandbox's disk (a root with /workspace inside, or a bare workspace). */
  snapshotDisk(snapshotId: string): string {
    return join(this.snapshotDir(snapshotId), 'disk');
  }

  /** Mode full: where the backend writes its checkpoint (processes and memory) of the snapshot. */
  snapshotCheckpoint(snapshotId: string): string {
    return join(this.snapshotDir(snapshotId), 'checkpoint');
  }

  /** Bytes of the checkpoint's files (its image of memory and processes). */
  async checkpointBytes(snapshotId: string): Promise<number> {
    return treeBytes(this.snapshotCheckpoint(snapshotId));
  }

  /** Writes the engine's own JSON record `name` of a snapshot beside its data (root's alone). */
  async writeSnapshotFile(snapshotId: string, name: string, value: unknown): Promise<void> {
    await mkdir(this.snapshotDir(snapshotId), { recursive: true, mode: 0o700 });
    const file = join(this.snapshotDir(snapshotId), name);
    await writeFile(`${file}.tmp`, JSON.stringify(value), { mode: 0o600 });
    await rename(`${file}.tmp`, file);
  }

  /** The record `name` of a snapshot, or undefined when it has none. */
  async readSnapshotFile(snapshotId: string, name: string): Promise<unknown> {
    const text = await readFile(join(this.snapshotDir(snapshotId), name), 'utf8').catch(() => undefined);
    return text === undefined ? undefined : (JSON.parse(text) as unknown);
  }

  snapshotVolume(snapshotId: string, volumeId: string): string {
    return join(this.snapshotDir(snapshotId), 'volumes', volumeId);
  }

  /** Whether `path` (a snapshot's disk or volume copy) is on the volume: a record can outlive its data. */
  present(path: string): boolean {
    return existsSync(path);
  }

  /**
   * A read-only snapshot of `sourceDir` (a sandbox's subvolume) as the snapshot's disk. The caller
   * holds the sandbox still (frozen or checkpointed) for the instant it takes.
   */
  async snapshotInto(sourceDir: string, snapshotId: string): Promise<string> {
    await mkdir(join(this.snapshotDir(snapshotId), 'volumes'), { recursive: true, mode: 0o700 });
    const disk = this.snapshotDisk(snapshotId);
    await runCommand(['btrfs', 'subvolume', 'snapshot', '-r', sourceDir, disk]);
    return disk;
  }

  /** Keeps a ready clone of the snapshot's disk for the sandboxes made from it (SpareClones). */
  keepSpare(snapshotId: string): void {
    this.volume.spares.keep(this.snapshotDisk(snapshotId));
  }

  /** Bytes a snapshot's copy of a volume refers to (its quota group's referenced bytes), or undefined. */
  snapshotVolumeBytes(snapshotId: string, volumeId: string): Promise<number | undefined> {
    return this.referencedBytes(this.snapshotVolume(snapshotId, volumeId));
  }

  async snapshotVolumeInto(volumeId: string, snapshotId: string): Promise<string> {
    const target = this.snapshotVolume(snapshotId, volumeId);
    await mkdir(join(this.snapshotDir(snapshotId), 'volumes'), { recursive: true, mode: 0o700 });
    await runCommand(['btrfs', 'subvolume', 'snapshot', '-r', this.volumePath(volumeId), target]);
    return target;
  }

  /** Deletes a snapshot and everything it holds; an absent one is fine. */
  async deleteSnapshot(snapshotId: string): Promise<void> {
    const dir = this.snapshotDir(snapshotId);
    if (!(await pathExists(dir))) return;
    const volumes = await readdir(join(dir, 'volumes')).catch(() => [] as string[]);
    for (const volumeId of volumes) await deleteSubvolume(this.snapshotVolume(snapshotId, volumeId));
    await this.volume.spares.discard(this.snapshotDisk(snapshotId));
    await deleteSubvolume(this.snapshotDisk(snapshotId));
    await rm(dir, { recursive: true, force: true });
  }

  /** Bytes the snapshot's disk holds (its quota group's referenced bytes), or undefined. */
  snapshotSizeBytes(snapshotId: string): Promise<number | undefined> {
    return this.referencedBytes(this.snapshotDisk(snapshotId));
  }

  /**
   * Referenced bytes of a read-only snapshot's quota group: counted by the commit that made it,
   * so no commit of its own. One spawn for the subvolume id; the volume knows its sysfs directory.
   */
  private async referencedBytes(path: string): Promise<number | undefined> {
    const id = await subvolumeId(path);
    return id === undefined ? undefined : (await this.volume.subvolumeUsage(id))?.referencedBytes;
  }

  /**
   * Bytes a live sandbox's disk holds as its own limit counts them (a root's exclusive bytes, a
   * workspace's referenced ones), after a commit so that recent writes show; undefined when unknown.
   */
  async sandboxDiskBytes(sandboxId: string): Promise<number | undefined> {
    await runCommand(['btrfs', 'filesystem', 'sync', this.volume.mountPoint]);
    return this.volume.usedBytes(sandboxId);
  }

  listSnapshots(): Promise<string[]> {
    return readdir(this.at('snapshots')).catch(() => [] as string[]);
  }

  // ---- volumes

  volumePath(volumeId: string): string {
    return this.at('volumes', volumeId);
  }

  /**
   * Gives a volume lent to a host-template sandbox's uid (see lendVolume) back to the stored user;
   * a stat when it is not lent. Only a top directory owned by one of those uids (the namespace
   * and gVisor backends' single uids, 3,000,000 to 4,999,999) is a lend: a template sandbox may
   * chown its volume's files to any user of its own, and that is kept.
   */
  async returnIfLent(volumeId: string): Promise<boolean> {
    const path = this.volumePath(volumeId);
    const info = await stat(path).catch(() => undefined);
    if (info === undefined || info.uid < LENT_UID_FIRST || info.uid > LENT_UID_LAST) return false;
    await returnVolume(path);
    return true;
  }

  /** A new empty volume holding at most `sizeBytes`, its top directory the stored user's. */
  async createVolume(volumeId: string, sizeBytes: number): Promise<string> {
    await mkdir(this.at('volumes'), { recursive: true, mode: 0o700 });
    const path = this.volumePath(volumeId);
    await runCommand(['btrfs', 'subvolume', 'create', path]);
    try {
      await runCommand(['btrfs', 'qgroup', 'limit', String(sizeBytes), path]);
      await chown(path, STORED_USER_ID, STORED_USER_ID);
      await chmod(path, 0o755);
    } catch (error) {
      await deleteSubvolume(path).catch(() => undefined);
      throw error;
    }
    return path;
  }

  /**
   * A new volume that starts as a writable copy of `sourceDir` (a snapshot's copy of a volume),
   * its quota limit `limitBytes`, given back to the stored user if the copy was lent when taken.
   */
  async createVolumeFrom(volumeId: string, sourceDir: string, limitBytes: number): Promise<string> {
    await mkdir(this.at('volumes'), { recursive: true, mode: 0o700 });
    const path = this.volumePath(volumeId);
    await runCommand(['btrfs', 'subvolume', 'snapshot', sourceDir, path]);
    try {
      // Given back before the limit: the chown's own writes must not meet a limit the copy fills.
      await this.returnIfLent(volumeId);
      await runCommand(['btrfs', 'qgroup', 'limit', String(limitBytes), path]);
    } catch (error) {
      await deleteSubvolume(path).catch(() => undefined);
      throw error;
    }
    return path;
  }

  /** How the volume's quotas count (decision 022). */
  accounting(): Promise<QuotaAccounting> {
    return this.volume.accounting();
  }

  async deleteVolume(volumeId: string): Promise<void> {
    await deleteSubvolume(this.volumePath(volumeId));
  }

  listVolumes(): Promise<string[]> {
    return readdir(this.at('volumes')).catch(() => [] as string[]);
  }

  /**
   * Bytes a volume holds as its quota counts them, or undefined when not readable. Quota groups
   * are counted at transaction commit: commit now so recent writes show, unless the caller just did.
   */
  async volumeUsedBytes(volumeId: string, options: { committed?: boolean } = {}): Promise<number | undefined> {
    if (options.committed !== true) await runCommand(['btrfs', 'filesystem', 'sync', this.volume.mountPoint]);
    const qgroup = await this.qgroupDir(this.volumePath(volumeId));
    if (qgroup === undefined) return undefined;
    return Number((await readFile(join(qgroup, 'referenced'), 'utf8')).trim());
  }

  // ---- read-only views of live disks

  /**
   * A read-only snapshot of a live disk for as long as `use` runs (a diff needs both sides
   * read-only); deleted afterwards whatever happens.
   */
  async withReadOnlyView<T>(sourceDir: string, use: (view: string) => Promise<T>, still?: { freeze(): Promise<void>; thaw(): Promise<void> }): Promise<T> {
    await mkdir(this.at('scratch'), { recursive: true, mode: 0o700 });
    const view = this.at('scratch', randomBytes(8).toString('hex'));
    // `still` holds the disk's writers for the instant of the snapshot (a sandbox's cgroup).
    await still?.freeze();
    try {
      await runCommand(['btrfs', 'subvolume', 'snapshot', '-r', sourceDir, view]);
    } finally {
      await still?.thaw();
    }
    try {
      return await use(view);
    } finally {
      await deleteSubvolume(view);
    }
  }

  /**
   * A read-only snapshot of a live disk that the caller drops (once whatever reads it is done,
   * e.g. a streamed export); views a crash left are cleared at the next start.
   */
  async openView(sourceDir: string, still?: { freeze(): Promise<void>; thaw(): Promise<void> }): Promise<{ view: string; drop: () => Promise<void> }> {
    await mkdir(this.at('scratch'), { recursive: true, mode: 0o700 });
    const view = this.at('scratch', randomBytes(8).toString('hex'));
    await still?.freeze();
    try {
      await runCommand(['btrfs', 'subvolume', 'snapshot', '-r', sourceDir, view]);
    } finally {
      await still?.thaw();
    }
    let dropped: Promise<void> | undefined;
    return { view, drop: () => (dropped ??= deleteSubvolume(view)) };
  }

  /** Views a crash left behind (nothing uses them after a restart). */
  async clearScratch(): Promise<void> {
    for (const entry of await readdir(this.at('scratch')).catch(() => [] as string[])) await deleteSubvolume(this.at('scratch', entry));
  }

  private async qgroupDir(path: string): Promise<string | undefined> {
    const id = Number((await runCommand(['btrfs', 'inspect-internal', 'rootid', path], { check: false })).stdout.trim());
    if (!Number.isInteger(id) || id <= 0) return undefined;
    const { stdout } = await runCommand(['btrfs', 'filesystem', 'show', '--raw', this.volume.mountPoint]);
    const fsid = /uuid: ([0-9a-f-]+)/.exec(stdout)?.[1];
    const dir = `/sys/fs/btrfs/${fsid}/qgroups/0_${id}`;
    return fsid !== undefined && (await pathExists(dir)) ? dir : undefined;
  }
}

/** Bytes of the regular files under `dir` (no symlinks followed); 0 when it is absent. */
async function treeBytes(dir: string): Promise<number> {
  let total = 0;
  for (const entry of await readdir(dir, { withFileTypes: true }).catch(() => [])) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) total += await treeBytes(path);
    else if (entry.isFile()) total += (await stat(path)).size;
  }
  return total;
}

/** Deletes a subvolume if it is there (read-only ones too). */
async function deleteSubvolume(path: string): Promise<void> {
  if (await pathExists(path)) await runCommand(['btrfs', 'subvolume', 'delete', path]);
}

/**
 * Gives a volume's files to a host-template sandbox's single uid while it writes them (its files
 * are stored as STORED_USER_ID, which template sandboxes see through an idmapped mount).
 */
export async function lendVolume(dir: string, uid: number): Promise<void> {
  await runCommand(['chown', '-R', '--no-dereference', `${uid}:${uid}`, dir]);
}

/** Gives a lent volume's files back to the stored user. */
export async function returnVolume(dir: string): Promise<void> {
  if (await pathExists(dir)) await runCommand(['chown', '-R', '--no-dereference', `${STORED_USER_ID}:${STORED_USER_ID}`, dir]);
}
