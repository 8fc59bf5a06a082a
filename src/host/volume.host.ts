import { closeSync, openSync } from 'node:fs';
import { chmod, chown, lstat, mkdir, open, readFile, readdir, rmdir, stat, statfs } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { SandboxError } from '../errors/index.js';
import { NextRun } from './next-run.js';
import { runCommand } from './run-command.host.js';
import { SpareClones } from './spare-clones.host.js';
import { withLock } from './lock.host.js';
import { packageRoot, pathExists } from './fs-util.js';
import { TOOLS_DIR } from './sandbox-layout.js';

/** How often a process holding the volume checks that its quota accounting is consistent (a sysfs read). */
const QUOTA_WATCH_MS = 2000;
/** The filesystem's own top subvolume (id 5): its quota group is never stale. */
const TOP_LEVEL_SUBVOLUME = 5;

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
  /** The helper that enables simple quotas on a new volume. @default dist/native/capsule-quota of this package */
  quotaTool?: string;
}

/**
 * How the volume's quota groups count (decision 022). `simple` (kernel 6.7+, every volume made
 * since): each extent is charged to the subvolume that wrote it, for as long as it lives, so a
 * snapshot shares its source's data without being charged for it and a limit bounds what a
 * subvolume writes; referenced and exclusive are the same figure. `full` (volumes made before, or
 * on an older kernel): extents are counted in every subvolume that refers to them, a backref walk
 * at each commit that touched shared data.
 */
export type QuotaAccounting = 'simple' | 'full';

export const WORKSPACE_PREFIX = 'ws-';
/** A sandbox from a template: one subvolume holding its whole root, `/workspace` inside it. */
export const ROOT_PREFIX = 'sb-';
/** A sandbox's line in `btrfs subvolume list`: `ID 257 gen 9 top level 5 path ws-<id>`. */
const SUBVOLUME_LINE = /^ID (\d+) .* path (ws-|sb-)([^/]+)$/;
/** The template's user as stored on disk (raw ids 0..65535, seen through an idmapped mount). */
const TEMPLATE_USER_ID = 1000;

/** What the volume can hold for workspaces, in bytes (see `WorkspaceVolume.capacity`). */
export interface VolumeCapacity {
  /** The image's size. */
  sizeBytes: number;
  /** What workspaces may be promised on the volume: its size less btrfs's own room. */
  usableBytes: number;
  /** What the host filesystem under the image can still back: its blocks so far plus the free space, less btrfs's room. */
  backableBytes: number;
}

/**
 * Room btrfs keeps for itself (metadata twice, the global reserve): measured, a 512 MiB volume
 * holds 384 MiB of workspaces filled to their quotas with 37 MiB to spare.
 */
export function volumeReserveBytes(sizeBytes: number): number {
  return Math.max(128 * 1024 * 1024, Math.ceil(sizeBytes / 10));
}

export class WorkspaceVolume {
  readonly image: string;
  readonly mountPoint: string;
  private readonly sizeBytes: number;
  private readonly quotaTool: string;
  private fsid: string | undefined;
  private accountingMode: QuotaAccounting | undefined;
  /**
   * An open directory on the mounted volume: while held, another process's umount gets EBUSY. A
   * plain fd, not a FileHandle: an instance dropped without release keeps it until the process
   * exits instead of warning when the collector closes it.
   */
  private hold: number | undefined;
  /** Subvolume ids by sandbox id (its `ws-` or `sb-` subvolume), learned once per sandbox. */
  private readonly subvolumeIds = new Map<string, number>();
  /**
   * Sandboxes being deleted, and those deleted while a listing ran: a listing that saw their
   * subvolumes before they went must not learn their ids again (nothing would forget them).
   */
  private readonly forgotten = { deleting: new Set<string>(), duringListing: new Set<string>(), listings: 0 };
  /** `btrfs subvolume list`, learning every sandbox's subvolume id (see qgroupDir). */
  private readonly listing = new NextRun(() => this.learnIds());
  /** `btrfs subvolume delete` of every path asked while the previous delete ran (see deleteSubvolume). */
  private readonly deletes = new NextRun<string>(async (paths) => {
    await runCommand(['btrfs', 'subvolume', 'delete', ...paths], { check: false });
  });
  /** Ready writable clones of the snapshots and layers that sandboxes start from (see SpareClones). */
  readonly spares: SpareClones;
  /** The quota rescan running, if one is (see keepQuotasHolding). */
  private rescanning: Promise<void> | undefined;
  private quotaWatch: NodeJS.Timeout | undefined;

  constructor(options: WorkspaceVolumeOptions) {
    this.image = join(options.dataDir, 'volume.img');
    this.mountPoint = join(options.dataDir, 'volume');
    this.sizeBytes = options.sizeBytes ?? 32 * 1024 ** 3;
    this.quotaTool = options.quotaTool ?? join(packageRoot(), 'dist', 'native', 'capsule-quota');
    this.spares = new SpareClones(this.mountPoint, async (paths) => {
      await Promise.all(paths.map((path) => this.deleteSubvolume(path)));
    });
  }

  /** Creates and mounts the volume if needed; idempotent and cheap when already mounted. */
  async ensure(): Promise<void> {
    if (await this.isMounted()) await this.holdMount();
    else await withLock(`${this.mountPoint}.lock`, () => this.mount());
    await this.keepQuotasHolding();
  }

  /**
   * Rescans the volume's quota accounting when the kernel marked it inconsistent (after which no
   * disk limit on it holds): on every ensure, so before each create, a read of one sysfs file.
   * Concurrent callers wait for one rescan. Not before the volume's uuid is known (the first
   * usage read learns it; the start-up pass, clearStaleQgroups, reads it first).
   */
  private async keepQuotasHolding(): Promise<void> {
    // Simple quotas keep no backref accounting to lose, and the kernel refuses to rescan them (EINVAL).
    if (!this.fsid || this.accountingMode === 'simple') return;
    const flag = await readFile(`/sys/fs/btrfs/${this.fsid}/qgroups/inconsistent`, 'utf8').catch(() => '0');
    if (flag.trim() !== '1') return;
    this.rescanning ??= runCommand(['btrfs', 'quota', 'rescan', '-w', this.mountPoint], { check: false, timeoutMs: 300_000 })
      .then(() => undefined)
      .finally(() => {
        this.rescanning = undefined;
      });
    await this.rescanning;
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
    // Its uuid names its sysfs directory: read again, the image may be a new one.
    this.fsid = undefined;
    // A volume keeps the mode it was made with: switching one in place would drop every limit
    // on it until the switch is done. One whose quotas are not on (made, then a crash) gets full.
    if (fresh) await this.enableQuotas();
    let mode = await this.readAccounting();
    if (mode === undefined) {
      await runCommand(['btrfs', 'quota', 'enable', this.mountPoint]);
      mode = 'full';
    }
    this.accountingMode = mode;
    await this.holdMount();
  }

  /** Simple quotas on a new volume when the kernel has them (the helper exits 2 when not); else quotas stay off for mount() to enable in full. */
  private async enableQuotas(): Promise<void> {
    if (await pathExists(this.quotaTool)) await runCommand([this.quotaTool, 'simple', this.mountPoint], { check: false });
  }

  /**
   * How the volume's quotas count (see QuotaAccounting): read from sysfs once it is mounted. A
   * mode the kernel does not report (before 6.7 there is no `mode` file) is full quota groups.
   */
  async accounting(): Promise<QuotaAccounting> {
    this.accountingMode ??= (await this.readAccounting()) ?? 'full';
    return this.accountingMode;
  }

  /** The mode sysfs reports, undefined when quotas are off. */
  private async readAccounting(): Promise<QuotaAccounting | undefined> {
    await this.readFsid();
    const qgroups = `/sys/fs/btrfs/${this.fsid}/qgroups`;
    if (!(await pathExists(qgroups))) return undefined;
    const mode = await readFile(join(qgroups, 'mode'), 'utf8').catch(() => 'qgroup');
    return mode.trim() === 'squota' ? 'simple' : 'full';
  }

  private holdMount(): Promise<void> {
    this.hold ??= openSync(this.mountPoint, 'r');
    // While this process holds the volume: a kernel that marks its quota accounting inconsistent
    // (this kernel does when it drops some deleted subvolumes) is answered within seconds, not
    // at the next create, so the running sandboxes' disk limits hold again.
    this.quotaWatch ??= setInterval(() => void this.keepQuotasHolding().catch(() => undefined), QUOTA_WATCH_MS);
    this.quotaWatch.unref();
    return Promise.resolve();
  }

  private letGo(): Promise<void> {
    if (this.hold !== undefined) closeSync(this.hold);
    this.hold = undefined;
    clearInterval(this.quotaWatch);
    this.quotaWatch = undefined;
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

  /**
   * Where sandbox `id`'s bare workspace subvolume is. The namespace backend has capsule-launch
   * make a fresh one there (`--subvolume`: the same subvolume, owner, mode and limit as
   * createWithoutLimit + setLimit, by ioctl); everything else about it is this class's.
   */
  path(id: string): string {
    return join(this.mountPoint, `${WORKSPACE_PREFIX}${id}`);
  }

  /** The root subvolume of a sandbox from a template (its /workspace is `workspace/` inside). */
  rootPath(id: string): string {
    return join(this.mountPoint, `${ROOT_PREFIX}${id}`);
  }

  /**
   * A sandbox's private root: a writable copy-on-write snapshot of a template layer (a read-only
   * subvolume on this volume; its spare clone when one is ready), with its /workspace inside, so
   * one quota counts both. Ids stay the template's raw 0..65535 (the sandbox sees them through an
   * idmapped mount); the workspace is the template user's. NO quota yet: the caller sets it (`setLimit`) before anything writes.
   */
  async createRoot(id: string, layerDir: string, options: { replenishLater?: boolean } = {}): Promise<{ root: string; workspace: string }> {
    const root = this.rootPath(id);
    // A layer's spare was readied already (keepLayerSpare): its checks would be three thread-pool trips.
    const readied = await this.spares.clone(layerDir, root, options);
    try {
      if (!readied) await readyRoot(root);
    } catch (error) {
      await this.delete(id).catch(() => undefined);
      throw error;
    }
    return { root, workspace: join(root, 'workspace') };
  }

  /**
   * Keeps a ready clone of a template layer for the sandboxes made from it, its root readied as
   * createRoot would (mode, /workspace): a create that takes it writes no metadata of its own
   * first, which on this volume waits for a commit under way (the next spare's, another's delete).
   * `warm` then readies what the sandbox's first command would otherwise wait for (the page cache
   * of the root's own loader and libc: warmFirstCommand).
   */
  keepLayerSpare(layerDir: string, warm?: (root: string) => Promise<void>): void {
    const prepare = warm === undefined ? readyRoot : async (root: string) => {
      await readyRoot(root);
      await warm(root);
    };
    // Two: a create right behind another finds one while the first's replacement waits for that
    // sandbox's first command (decision 025).
    this.spares.keep(layerDir, prepare, 2);
  }

  /** Whether the sandbox's disk is a root from a template (else a bare workspace). */
  async isRoot(id: string): Promise<boolean> {
    return pathExists(this.rootPath(id));
  }

  /**
   * A workspace that starts as a writable copy-on-write snapshot of `sourceDir` (a snapshot of
   * another sandbox's workspace; its spare clone when one is ready), given to `uid`: the files
   * keep their content and modes, their owner becomes the new sandbox's host uid. NO quota yet, as createWithoutLimit.
   */
  async createWorkspaceFrom(id: string, sourceDir: string, uid: number): Promise<string> {
    const path = this.path(id);
    await this.spares.clone(sourceDir, path);
    try {
      await own(path, uid);
      await runCommand(['chown', '-R', '--no-dereference', `${uid}:${uid}`, path]);
    } catch (error) {
      await this.delete(id).catch(() => undefined);
      throw error;
    }
    return path;
  }

  /** The subvolume holding the sandbox's files: its root (from a template) or its bare workspace. */
  async diskPath(id: string): Promise<{ path: string; kind: 'root' | 'workspace' }> {
    return (await this.isRoot(id)) ? { path: this.rootPath(id), kind: 'root' } : { path: this.path(id), kind: 'workspace' };
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
    if (await this.isRoot(id)) {
      // A root keeps the template's raw ids; only its quota is set again.
      await this.setLimit(id, diskBytes);
      return join(this.rootPath(id), 'workspace');
    }
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
    // A root shares the template's extents: only what the sandbox itself wrote counts (-e).
    if (await this.isRoot(id)) await runCommand(['btrfs', 'qgroup', 'limit', '-e', String(diskBytes), this.rootPath(id)]);
    else await runCommand(['btrfs', 'qgroup', 'limit', String(diskBytes), this.path(id)]);
  }

  /**
   * Sets a new disk's quota (a template root's, a gVisor workspace's) while `starting` (its
   * sandbox's start) runs: nothing in a sandbox writes to its workspace before create() returns, and
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
    this.subvolumeIds.delete(id);
    this.forgotten.deleting.add(id);
    if (this.forgotten.listings > 0) this.forgotten.duringListing.add(id);
    try {
      for (const path of [this.path(id), this.rootPath(id)]) {
        if (await pathExists(path)) await this.deleteSubvolume(path);
      }
    } finally {
      this.forgotten.deleting.delete(id);
    }
  }

  /**
   * Deletes a subvolume, in one `btrfs subvolume delete` with every other delete asked while the
   * previous one ran (sandboxes ending together, a churning server: one spawn between them). A
   * path the batch left (its delete failed) is deleted again on its own, so its caller gets its
   * own error.
   */
  private async deleteSubvolume(path: string): Promise<void> {
    if (await removeIfEmpty(path)) return;
    await this.deletes.join(path);
    if (await pathExists(path)) await runCommand(['btrfs', 'subvolume', 'delete', path]);
  }

  /**
   * Bytes the sandbox's disk holds as the quota counts them, or undefined when not readable: a
   * workspace's referenced bytes, a root's exclusive ones (what it wrote beyond its template).
   * Under simple quotas both are what the sandbox itself wrote: a workspace made from a snapshot
   * is not charged the snapshot's data (the snapshot is, decision 022).
   */
  async usedBytes(id: string): Promise<number | undefined> {
    const isRoot = await this.isRoot(id);
    const qgroup = await this.qgroupDir(id, isRoot ? this.rootPath(id) : this.path(id));
    if (!qgroup) return undefined;
    return Number((await readFile(join(qgroup, isRoot ? 'exclusive' : 'referenced'), 'utf8')).trim());
  }

  /**
   * What the volume can hold for workspaces. The image is sparse: it takes host blocks as
   * workspaces fill, so what it can back is also bounded by the host filesystem's free space.
   */
  async capacity(): Promise<VolumeCapacity> {
    const [image, host] = await Promise.all([stat(this.image), statfs(dirname(this.image))]);
    const reserve = volumeReserveBytes(image.size);
    const hostBytes = image.blocks * 512 + host.bavail * host.bsize;
    return {
      sizeBytes: image.size,
      usableBytes: Math.max(0, image.size - reserve),
      backableBytes: Math.max(0, Math.min(image.size, hostBytes) - reserve),
    };
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

  /** Sandboxes with a disk on the volume (workspaces and roots), for reconciliation after a crash. */
  async list(): Promise<string[]> {
    const entries = await readdir(this.mountPoint).catch(() => [] as string[]);
    const ids = new Set<string>();
    for (const entry of entries) {
      for (const prefix of [WORKSPACE_PREFIX, ROOT_PREFIX]) if (entry.startsWith(prefix)) ids.add(entry.slice(prefix.length));
    }
    return [...ids];
  }

  /**
   * Drops quota groups of deleted subvolumes that the kernel keeps (newer kernels drop them
   * themselves once the subvolume is gone). Only one whose numbers are 0: a subvolume deleted but
   * not yet dropped by btrfs's cleaner still has them, and destroying its quota group then marks
   * every quota group of the volume inconsistent, which stops every disk limit on it (seen in
   * CI: `btrfs qgroup clear-stale` ran while a template root was being dropped, and later
   * sandboxes wrote past their limits). That one waits for a later pass. A volume found
   * inconsistent anyway is rescanned, so that its limits hold again (as every ensure does).
   */
  async clearStaleQgroups(): Promise<void> {
    await this.readFsid();
    const qgroups = `/sys/fs/btrfs/${this.fsid}/qgroups`;
    const listed = await runCommand(['btrfs', 'subvolume', 'list', this.mountPoint], { check: false });
    const live = new Set([...listed.stdout.matchAll(/^ID (\d+) /gm)].map((m) => Number(m[1])));
    for (const entry of await readdir(qgroups).catch(() => [] as string[])) {
      const id = Number(/^0_(\d+)$/.exec(entry)?.[1] ?? NaN);
      if (!Number.isInteger(id) || id === TOP_LEVEL_SUBVOLUME || live.has(id)) continue;
      const numbers = await Promise.all(['referenced', 'exclusive'].map((file) => readFile(join(qgroups, entry, file), 'utf8').then(Number, () => NaN)));
      if (numbers.some((n) => n !== 0)) continue;
      await runCommand(['btrfs', 'qgroup', 'destroy', `0/${id}`, this.mountPoint], { check: false });
    }
    await this.keepQuotasHolding();
  }

  private async qgroupDir(id: string, path: string): Promise<string | undefined> {
    await this.readFsid();
    // The quota group of subvolume N is 0/N, which the kernel exposes in sysfs: reading usage
    // needs no spawn once the id is known.
    if (!this.subvolumeIds.has(id) && (await pathExists(path))) await this.listing.join();
    const subvolId = this.subvolumeIds.get(id);
    if (subvolId === undefined) return undefined;
    const dir = `/sys/fs/btrfs/${this.fsid}/qgroups/0_${subvolId}`;
    return (await pathExists(dir)) ? dir : undefined;
  }

  /**
   * Learns the subvolume id of every sandbox on the volume from one `btrfs subvolume list`, run
   * through `listing` (callers join the one not started yet, so it sees every subvolume made
   * before they asked): with a thousand sandboxes starting, their first usage reads cost one
   * spawn between them instead of one each (a spawn from a server that large costs ~3 ms of CPU).
   */
  private async learnIds(): Promise<void> {
    const { forgotten } = this;
    forgotten.listings++;
    try {
      const { stdout } = await runCommand(['btrfs', 'subvolume', 'list', this.mountPoint], { check: false });
      for (const line of stdout.split('\n')) {
        const match = SUBVOLUME_LINE.exec(line);
        const id = match?.[3];
        if (id === undefined || forgotten.deleting.has(id) || forgotten.duringListing.has(id)) continue;
        this.subvolumeIds.set(id, Number(match![1]));
      }
    } finally {
      if (--forgotten.listings === 0) forgotten.duringListing.clear();
    }
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

/**
 * A sandbox root as it starts: mode 0755, a /workspace of the template user's, and the empty
 * directory the sandbox's tools are mounted on (TOOLS_DIR: bwrap would make it, a metadata write
 * that waits for any commit under way on the volume, such as the next spare's snapshot). A
 * snapshot of a sandbox has them already, with the owner the sandbox gave its /workspace; a spare
 * readied before (keepLayerSpare) has them, and then nothing is written.
 */
async function readyRoot(root: string): Promise<void> {
  const workspace = join(root, 'workspace');
  if (((await stat(root)).mode & 0o7777) !== 0o755) await chmod(root, 0o755);
  if (!(await pathExists(workspace))) {
    await mkdir(workspace, { recursive: true, mode: 0o755 });
    await chown(workspace, TEMPLATE_USER_ID, TEMPLATE_USER_ID);
  }
  // Not followed: a template's own /.capsule (a link, a file) is left for bwrap to refuse or use inside the sandbox.
  const tools = join(root, TOOLS_DIR);
  if ((await lstat(tools).catch(() => undefined)) === undefined) await mkdir(tools, { mode: 0o755 });
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

/**
 * rmdir(2) of an empty subvolume deletes it as `btrfs subvolume delete` does (the same kernel
 * call, Linux 4.18+), without a process: a sandbox that left its workspace empty (a one-shot
 * `capsule run`, most warm-pool spares) ends with one syscall. False when it holds anything, or
 * when the kernel refuses: the caller deletes it the full way, and gets that way's error.
 */
async function removeIfEmpty(path: string): Promise<boolean> {
  try {
    await rmdir(path);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'ENOENT';
  }
}
