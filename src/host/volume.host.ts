import { closeSync, openSync } from 'node:fs';
import { chmod, chown, mkdir, open, readFile, readdir, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { SandboxError } from '../errors/index.js';
import { runCommand } from './run-command.host.js';
import { withLock } from './lock.host.js';
import { pathExists } from './fs-util.js';

/**
 * Workspaces live on one loop-mounted btrfs volume: a subvolume per sandbox, bounded by a quota
 * group. Creating one costs two short `btrfs` calls (~5 ms), deleting one is O(1), the quota is
 * not charged to the sandbox's memory limit (unlike tmpfs), and snapshots are cheap for later
 * pause and fork. See docs/decisions/001-workspace-on-btrfs.md.
 */
export interface WorkspaceVolumeOptions {
  /** Directory holding `volume.img` and the mount point `volume/`. */
  dataDir: string;
  /** Sparse size of the image file. @default 32 GiB */
  sizeBytes?: number;
}

export const WORKSPACE_PREFIX = 'ws-';

export class WorkspaceVolume {
  readonly image: string;
  readonly mountPoint: string;
  private readonly sizeBytes: number;
  private fsid: string | undefined;
  /**
   * An open directory on the mounted volume: while held, another process's umount gets EBUSY. A
   * plain fd, not a FileHandle: an instance dropped without release keeps it until the process
   * exits instead of warning when the collector closes it.
   */
  private hold: number | undefined;
  /** Subvolume ids by workspace id, learned once per workspace. */
  private readonly subvolumeIds = new Map<string, number>();

  constructor(options: WorkspaceVolumeOptions) {
    this.image = join(options.dataDir, 'volume.img');
    this.mountPoint = join(options.dataDir, 'volume');
    this.sizeBytes = options.sizeBytes ?? 32 * 1024 ** 3;
  }

  /** Creates and mounts the volume if needed; idempotent and cheap when already mounted. */
  async ensure(): Promise<void> {
    if (await this.isMounted()) {
      await this.holdMount();
      return;
    }
    await withLock(`${this.mountPoint}.lock`, () => this.mount());
  }

  private async mount(): Promise<void> {
    if (await this.isMounted()) {
      await this.holdMount();
      return;
    }
    await mkdir(this.mountPoint, { recursive: true, mode: 0o700 });
    const fresh = !(await pathExists(this.image));
    if (fresh) {
      const handle = await open(this.image, 'w', 0o600);
      await handle.truncate(this.sizeBytes);
      await handle.close();
      await runCommand(['mkfs.btrfs', '-q', '-f', this.image]);
    }
    await runCommand(['mount', '-o', 'loop,nosuid,nodev,noatime', this.image, this.mountPoint]);
    await runCommand(['btrfs', 'quota', 'enable', this.mountPoint]);
    await this.holdMount();
  }

  private holdMount(): Promise<void> {
    this.hold ??= openSync(this.mountPoint, 'r');
    return Promise.resolve();
  }

  private letGo(): Promise<void> {
    if (this.hold !== undefined) closeSync(this.hold);
    this.hold = undefined;
    return Promise.resolve();
  }

  async isMounted(): Promise<boolean> {
    const mounts = await readFile('/proc/self/mountinfo', 'utf8');
    return mounts.split('\n').some((line) => line.split(' ')[4] === this.mountPoint);
  }

  /** Unmounts the volume (and with it the loop device). */
  async unmount(): Promise<void> {
    await this.letGo();
    if (await this.isMounted()) await runCommand(['umount', this.mountPoint]);
  }

  /**
   * Unmounts the volume when no workspace is left on it, so an idle host keeps no mount of ours.
   * Another Capsule process using it makes umount fail with EBUSY, which is fine: it stays.
   */
  async releaseIfIdle(): Promise<void> {
    if (!(await this.isMounted()) || (await this.list()).length > 0) return;
    await this.letGo();
    await runCommand(['umount', this.mountPoint], { check: false });
  }

  path(id: string): string {
    return join(this.mountPoint, `${WORKSPACE_PREFIX}${id}`);
  }

  /** A new empty workspace owned by `uid`, holding at most `diskBytes`. */
  async create(id: string, diskBytes: number, uid: number): Promise<string> {
    const path = this.path(id);
    await runCommand(['btrfs', 'subvolume', 'create', path]);
    try {
      await runCommand(['btrfs', 'qgroup', 'limit', String(diskBytes), path]);
      await own(path, uid);
    } catch (error) {
      await this.delete(id).catch(() => undefined);
      throw error;
    }
    return path;
  }

  /**
   * A new empty workspace owned by `uid` with NO quota yet: one `btrfs` spawn instead of two, for
   * a caller that has other slow work to overlap with `setLimit()` (gVisor boots its sandbox
   * meanwhile). The caller must await `setLimit()` before anything may write to the workspace.
   */
  async createWithoutLimit(id: string, uid: number): Promise<string> {
    const path = this.path(id);
    await runCommand(['btrfs', 'subvolume', 'create', path]);
    try {
      await own(path, uid);
    } catch (error) {
      await this.delete(id).catch(() => undefined);
      throw error;
    }
    return path;
  }

  /**
   * Takes over the workspace a previous Capsule process left for this id (after a crash): the
   * quota is set again and, if the sandbox now runs as another uid, ownership follows.
   */
  async adopt(id: string, diskBytes: number, uid: number): Promise<string> {
    const path = this.path(id);
    const info = await stat(path).catch(() => undefined);
    if (!info?.isDirectory()) {
      throw new SandboxError('SANDBOX_NOT_FOUND', `the workspace of sandbox ${id} no longer exists`, { details: { sandboxId: id } });
    }
    await runCommand(['btrfs', 'qgroup', 'limit', String(diskBytes), path]);
    if (info.uid !== uid) await runCommand(['chown', '-R', '--no-dereference', `${uid}:${uid}`, path]);
    await chmod(path, 0o700);
    return path;
  }

  /** Changes the quota of a live workspace. */
  async setLimit(id: string, diskBytes: number): Promise<void> {
    await runCommand(['btrfs', 'qgroup', 'limit', String(diskBytes), this.path(id)]);
  }

  /**
   * Sets a fresh workspace's quota while `starting` (its sandbox's start, one process spawn off
   * the path) runs: nothing in a sandbox writes to its workspace before create() returns, and
   * both are awaited. A sandbox whose quota could not be set is destroyed.
   */
  async limitWhile<T extends { destroy(): Promise<void> }>(id: string, diskBytes: number, starting: Promise<T>): Promise<T> {
    const [started, limited] = await Promise.allSettled([starting, this.setLimit(id, diskBytes)]);
    if (started.status === 'rejected') throw started.reason;
    if (limited.status === 'rejected') {
      await started.value.destroy().catch(() => undefined);
      throw limited.reason;
    }
    return started.value;
  }

  async delete(id: string): Promise<void> {
    const path = this.path(id);
    this.subvolumeIds.delete(id);
    if (!(await pathExists(path))) return;
    await runCommand(['btrfs', 'subvolume', 'delete', path]);
  }

  /** Bytes the workspace holds as the quota counts them, or undefined when not readable. */
  async usedBytes(id: string): Promise<number | undefined> {
    const qgroup = await this.qgroupDir(id);
    if (!qgroup) return undefined;
    return Number((await readFile(join(qgroup, 'referenced'), 'utf8')).trim());
  }

  /**
   * Referenced and exclusive bytes of any subvolume on the volume by its id, as its quota group
   * counts them after the last transaction commit; undefined when the group is gone.
   */
  async subvolumeUsage(subvolumeId: number): Promise<{ referencedBytes: number; exclusiveBytes: number } | undefined> {
    await this.readFsid();
    const dir = `/sys/fs/btrfs/${this.fsid}/qgroups/0_${subvolumeId}`;
    const [referenced, exclusive] = await Promise.all(['referenced', 'exclusive'].map((f) => readFile(join(dir, f), 'utf8').catch(() => undefined)));
    if (referenced === undefined || exclusive === undefined) return undefined;
    return { referencedBytes: Number(referenced.trim()), exclusiveBytes: Number(exclusive.trim()) };
  }

  /** Workspaces present on the volume, for reconciliation after a crash. */
  async list(): Promise<string[]> {
    const entries = await readdir(this.mountPoint).catch(() => [] as string[]);
    return entries.filter((e) => e.startsWith(WORKSPACE_PREFIX)).map((e) => e.slice(WORKSPACE_PREFIX.length));
  }

  /** Drops quota groups of deleted subvolumes (the kernel keeps them until asked). */
  async clearStaleQgroups(): Promise<void> {
    await runCommand(['btrfs', 'qgroup', 'clear-stale', this.mountPoint], { check: false });
  }

  private async qgroupDir(id: string): Promise<string | undefined> {
    await this.readFsid();
    // The quota group of subvolume N is 0/N, which the kernel exposes in sysfs: reading usage
    // needs no spawn once the id is known.
    let subvolId = this.subvolumeIds.get(id);
    if (subvolId === undefined) {
      subvolId = await subvolumeId(this.path(id));
      if (subvolId === undefined) return undefined;
      this.subvolumeIds.set(id, subvolId);
    }
    const dir = `/sys/fs/btrfs/${this.fsid}/qgroups/0_${subvolId}`;
    return (await pathExists(dir)) ? dir : undefined;
  }

  /** The filesystem's uuid names its sysfs directory; read once, when usage is first asked. */
  private async readFsid(): Promise<void> {
    if (this.fsid) return;
    const { stdout } = await runCommand(['btrfs', 'filesystem', 'show', '--raw', this.mountPoint]);
    const match = /uuid: ([0-9a-f-]+)/.exec(stdout);
    if (!match?.[1]) throw new SandboxError('HOST_NOT_READY', `cannot read the btrfs uuid of ${this.mountPoint}`);
    this.fsid = match[1];
  }
}

/** A workspace is its sandbox's alone: owned by its host uid, 0700 (btrfs makes it 0755). */
async function own(path: string, uid: number): Promise<void> {
  await chown(path, uid, uid);
  await chmod(path, 0o700);
}

/** The btrfs subvolume id of `path` (one `btrfs` spawn), or undefined when it is not a subvolume. */
export async function subvolumeId(path: string): Promise<number | undefined> {
  const result = await runCommand(['btrfs', 'inspect-internal', 'rootid', path], { check: false });
  const id = Number(result.stdout.trim());
  return Number.isInteger(id) && id > 0 ? id : undefined;
}

