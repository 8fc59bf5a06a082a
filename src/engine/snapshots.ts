import { SandboxError } from '../errors/index.js';
import type { BackendSandbox } from '../backends/backend.js';
import type { WorkspaceVolume } from '../host/volume.host.js';
import { StoredDisks } from '../host/stored-disks.host.js';
import type { SnapshotRecordStore } from '../store/snapshot-records.js';
import type { SandboxInfo, SnapshotInfo, SnapshotVolume, VolumeInfo } from '../wire/index.js';
import type { DiskBudget } from './disk-budget.js';
import { InFlight } from './in-flight.js';
import { newSandboxId } from './ids.js';
import type { ContextSnapshot } from './interpreter/index.js';
import type { LiveSandbox } from './sandbox-table.js';

export interface TakeSnapshotOptions {
  name?: string;
  mode?: 'filesystem' | 'full';
  /** Keep a copy of each volume the sandbox mounts, taken at the instant of its disk. @default false */
  includeVolumes?: boolean;
  /**
   * Keep a ready clone of its disk, so that the next sandbox made from it takes a rename instead
   * of a snapshot (SpareClones). @default true
   */
  readyClone?: boolean;
}

/** One of the sandbox's volume mounts with its volume's record, as the manager resolves them. */
export interface MountedVolume {
  name: string;
  path: string;
  readOnly: boolean;
  volume: VolumeInfo;
}

/** What a sandbox made from a full snapshot resumes from. */
export interface FullSnapshot {
  /** The backend's checkpoint directory (CreateOptions.restoreFrom). */
  checkpointDir: string;
  /** The interpreter contexts whose drivers resume with it. */
  contexts: ContextSnapshot[];
}

const CONTEXTS_FILE = 'contexts.json';

/**
 * Snapshots of sandboxes: a read-only btrfs snapshot of the sandbox's disk (its root with
 * /workspace inside, or the host template's bare workspace) taken while its cgroup is frozen, so
 * root and workspace are one instant; its processes only see a pause of a few milliseconds. Mode
 * `full` (a backend with `checkpoint`: gVisor) also keeps processes and memory: the disk is
 * snapshotted while the checkpoint holds the sandbox stopped (decision 017). The record (tenant,
 * lineage, the source's spec) is in the store; the data under `snapshots/<id>`.
 */
export class Snapshots {
  readonly disks: StoredDisks;
  private readonly deleting = new InFlight();
  /** Snapshots sandboxes are being made from, and how many. */
  private readonly held = new Map<string, number>();

  constructor(
    private readonly volume: WorkspaceVolume,
    private readonly store: SnapshotRecordStore,
    private readonly now: () => number,
    /** Where each snapshot is charged to its tenant's disk quota. @default nothing is charged */
    private readonly budget?: DiskBudget,
  ) {
    this.disks = new StoredDisks(volume);
  }

  /** The tenant's snapshot; another tenant's id is SNAPSHOT_NOT_FOUND, as an unknown one. */
  find(tenantId: string, snapshotId: string): SnapshotInfo {
    const record = this.store.get(tenantId, snapshotId);
    if (!record) {
      throw new SandboxError('SNAPSHOT_NOT_FOUND', `snapshot ${snapshotId} not found`, {
        details: { snapshotId },
        hint: 'List your snapshots with `capsule snapshot ls` (GET /v1/snapshots); snapshots of other tenants are not visible.',
      });
    }
    return record;
  }

  list(tenantId: string): SnapshotInfo[] {
    return this.store.list(tenantId);
  }

  /**
   * Takes a filesystem snapshot of a running or paused sandbox. Running, it is frozen for the
   * instant of the snapshot and thawed whatever happens; paused, it is still already.
   */
  async take(
    entry: LiveSandbox & { sandbox: BackendSandbox },
    options: TakeSnapshotOptions,
    contexts: () => Promise<ContextSnapshot[]> = () => Promise.resolve([]),
    mounted: readonly MountedVolume[] = [],
  ): Promise<SnapshotInfo> {
    const info = entry.info;
    const sandbox = entry.sandbox;
    if (options.mode === 'full' && !sandbox.checkpoint) {
      throw new SandboxError('BACKEND_CANNOT_ENFORCE', `backend ${info.backend} cannot keep processes and memory in a snapshot on this server`, {
        details: { sandboxId: info.sandboxId, backend: info.backend, mode: 'full' },
        hint: 'Take a filesystem snapshot (mode "filesystem"): files of root and workspace are kept, processes start anew in a sandbox made from it. Sandboxes of the gvisor backend can keep their processes (mode "full").',
      });
    }
    if (options.mode === 'full' && info.state !== 'running') {
      throw new SandboxError('SANDBOX_NOT_RUNNING', `sandbox ${info.sandboxId} is ${info.state}; a full snapshot is taken of a running sandbox`, {
        details: { sandboxId: info.sandboxId, state: info.state, mode: 'full' },
        hint: 'Resume it first, or take a filesystem snapshot of it as it is.',
      });
    }
    const snapshotId = `snap_${newSandboxId()}`;
    const disk = await this.volume.diskPath(info.sandboxId);
    const simple = (await this.volume.accounting()) === 'simple';
    // Charged what the sandbox's disk holds beyond its template, as its limit counts it, plus what
    // it kept of its origin and of the volumes it copied. Under simple quotas all of it is read
    // after the snapshot: a sandbox's own quota group keeps counting what it wrote for as long as
    // a snapshot holds it, so the figure can only be above the snapshot's share, and writes up to
    // the freeze count too. Under full quota groups a root's exclusive bytes are read before (the
    // snapshot shares them once made: charged before anything is made, after a commit; writes in
    // the milliseconds before the freeze do not count), a host-template workspace's referenced
    // bytes off the snapshot's own group once its commit is done. Read after the snapshot, a
    // charge past the quota (QUOTA_EXCEEDED) removes the snapshot: nothing stays uncharged.
    const owner = { tenantId: info.tenantId, ...(entry.quotaBytes !== undefined ? { quotaBytes: entry.quotaBytes } : {}) };
    const diskBefore = !simple && (disk.kind === 'root' || options.mode === 'full');
    let chargedBytes = diskBefore ? ((await this.disks.sandboxDiskBytes(info.sandboxId)) ?? 0) + this.originCharge(info, disk.kind, simple) : 0;
    this.budget?.reserveStored(owner, 'snapshots', chargedBytes);
    const uncharge = () => this.budget?.releaseStored(owner, 'snapshots', chargedBytes);
    const charge = (bytes: number) => {
      this.budget?.reserveStored(owner, 'snapshots', bytes);
      chargedBytes += bytes;
    };
    // A volume mounted at two paths is copied once.
    const copied = options.includeVolumes === true ? [...new Map(mounted.map((m) => [m.volume.volumeId, m.volume])).values()] : [];
    const copiedIds = copied.map((v) => v.volumeId);
    let checkpoint: SnapshotInfo['checkpoint'];
    let sizeBytes: number | undefined;
    let copyBytes = new Map<string, number>();
    try {
      if (options.mode === 'full') {
        checkpoint = await this.takeFull(sandbox, disk.path, snapshotId, await contexts(), copiedIds);
        // The image of its memory and processes is stored too, and counts as its disk does.
        charge(await this.disks.checkpointBytes(snapshotId));
      } else {
        await this.takeFilesystem(entry, disk.path, snapshotId, copiedIds);
      }
      if (!diskBefore) {
        const own = simple ? ((await this.disks.sandboxDiskBytes(info.sandboxId)) ?? 0) : ((await this.disks.snapshotSizeBytes(snapshotId)) ?? 0);
        if (!simple) sizeBytes = own;
        charge(own + this.originCharge(info, disk.kind, simple));
      }
      copyBytes = await this.copiedBytes(snapshotId, copied, simple);
      charge([...copyBytes.values()].reduce((sum, n) => sum + n, 0));
    } catch (error) {
      await this.disks.deleteSnapshot(snapshotId).catch(() => undefined);
      uncharge();
      throw error;
    }
    const volumes: SnapshotVolume[] = mounted.map((m) => {
      const used = copyBytes.get(m.volume.volumeId);
      return { name: m.name, volumeId: m.volume.volumeId, path: m.path, readOnly: m.readOnly, included: used !== undefined, sizeBytes: m.volume.sizeBytes, ...(used !== undefined && { usedBytes: used }) };
    });
    // Under simple quotas the snapshot's own quota group holds nothing (its data stays charged to
    // the subvolumes that wrote it): its size is what it was charged.
    if (simple) sizeBytes = chargedBytes;
    const record: SnapshotInfo = {
      snapshotId,
      tenantId: info.tenantId,
      ...(options.name !== undefined ? { name: options.name } : {}),
      mode: checkpoint ? 'full' : 'filesystem',
      sandboxId: info.sandboxId,
      ...(info.origin ? { parentSnapshotId: info.origin.snapshotId } : {}),
      template: info.spec.template ?? 'host',
      backend: info.backend,
      disk: disk.kind,
      chargedBytes,
      ...(sizeBytes !== undefined ? { sizeBytes } : {}),
      createdAt: new Date(this.now()).toISOString(),
      spec: structuredClone(info.spec),
      volumes,
      ...(checkpoint ? { checkpoint } : {}),
    };
    try {
      this.store.upsert(record);
    } catch (error) {
      await this.disks.deleteSnapshot(snapshotId).catch(() => undefined);
      uncharge();
      throw error;
    }
    // Otherwise its size is read off the path (two btrfs spawns): GET and list show it once known.
    // Best effort: a size the kernel does not give, or a store closed meanwhile, leaves it absent.
    if (sizeBytes === undefined) void this.recordSize(record).catch(() => undefined);
    if (options.readyClone !== false) this.disks.keepSpare(snapshotId);
    return structuredClone(record);
  }

  /**
   * What a snapshot of this sandbox keeps that the sandbox's own figure leaves out: the data of
   * the snapshot it was made from, whenever that figure counts only what the sandbox wrote (a
   * root's exclusive bytes; any disk under simple quotas). The origin's whole charge, as it was
   * recorded, less the volume copies it kept (a full origin's memory image is in: erring on the side of charging). Without it a
   * chain escaped the quota: sandbox B from snapshot S, B snapshotted as S2, B and then S
   * deleted (S had no live dependent left), and S2 kept S's data charged to nobody. An origin
   * cannot be gone while the sandbox lives (its delete is refused).
   */
  private originCharge(info: SandboxInfo, kind: 'root' | 'workspace', simple: boolean): number {
    if (!info.origin || (kind === 'workspace' && !simple)) return 0;
    const origin = this.store.get(info.tenantId, info.origin.snapshotId);
    if (!origin) return 0;
    // Not the volume copies it kept: a sandbox made from it does not hold them.
    const copies = new Map((origin.volumes ?? []).filter((v) => v.included).map((v) => [v.volumeId, v.usedBytes ?? 0]));
    return Math.max(0, (origin.chargedBytes ?? 0) - [...copies.values()].reduce((sum, n) => sum + n, 0));
  }

  /**
   * What each volume's copy holds, read once the copies are made: under full quota groups the
   * copy's own referenced bytes; under simple quotas the volume's own count (which cannot fall
   * below what the copy shares of it) plus, for a volume made from an earlier copy, the bytes it
   * started with, which its own group never counted (decision 022). Writes after the copy make
   * the figure larger, never smaller. Under simple quotas the commit that the sandbox's own figure
   * was read after (take) came after the copies too: none is made again per volume.
   */
  private async copiedBytes(snapshotId: string, copied: readonly VolumeInfo[], simple: boolean): Promise<Map<string, number>> {
    const bytes = new Map<string, number>();
    for (const volume of copied) {
      const read = simple ? await this.disks.volumeUsedBytes(volume.volumeId, { committed: true }) : await this.disks.snapshotVolumeBytes(snapshotId, volume.volumeId);
      // Unreadable: charged as full as it may be.
      bytes.set(volume.volumeId, read === undefined ? volume.sizeBytes : read + (simple ? (volume.origin?.bytes ?? 0) : 0));
    }
    return bytes;
  }

  /** Running, the sandbox is frozen for the instant of the btrfs snapshots (its disk, the volumes copied); paused, it is still already. */
  private async takeFilesystem(entry: LiveSandbox & { sandbox: BackendSandbox }, diskPath: string, snapshotId: string, volumeIds: readonly string[]): Promise<void> {
    const frozen = entry.info.state === 'running';
    if (frozen) await entry.sandbox.freeze();
    try {
      await this.copyAll(diskPath, snapshotId, volumeIds);
    } finally {
      if (frozen) await entry.sandbox.thaw();
    }
  }

  /**
   * The backend's checkpoint of processes and memory, with the disk snapshotted while the
   * checkpoint holds the sandbox stopped: disk and memory are one instant. The source goes on
   * from the checkpoint; `contexts` (taken before) are kept for those whose drivers it saved.
   */
  private async takeFull(sandbox: BackendSandbox, diskPath: string, snapshotId: string, contexts: ContextSnapshot[], volumeIds: readonly string[]): Promise<SnapshotInfo['checkpoint']> {
    const saved = await sandbox.checkpoint!(this.disks.snapshotCheckpoint(snapshotId), () => this.copyAll(diskPath, snapshotId, volumeIds));
    const kept = contexts.filter((c) => saved.processIds.includes(c.processId));
    await this.disks.writeSnapshotFile(snapshotId, CONTEXTS_FILE, kept);
    return { processCount: saved.processIds.length, contexts: kept.map((c) => ({ id: c.info.id, language: c.info.language })) };
  }

  /** The sandbox's disk and the volumes copied, each a read-only btrfs snapshot, while the sandbox is held still. */
  private async copyAll(diskPath: string, snapshotId: string, volumeIds: readonly string[]): Promise<void> {
    await this.disks.snapshotInto(diskPath, snapshotId);
    for (const volumeId of volumeIds) await this.disks.snapshotVolumeInto(volumeId, snapshotId);
  }

  /**
   * Where a volume made from the snapshot's copy of `name` copies from, with the copy's record;
   * VOLUME_NOT_FOUND when the snapshot kept no copy of it.
   */
  volumeCopy(snapshot: SnapshotInfo, name: string): { dir: string; volume: SnapshotVolume & { usedBytes: number } } {
    const volume = snapshot.volumes?.find((v) => v.name === name && v.included);
    if (!volume || volume.usedBytes === undefined) {
      const kept = (snapshot.volumes ?? []).filter((v) => v.included).map((v) => v.name);
      throw new SandboxError('VOLUME_NOT_FOUND', `snapshot ${snapshot.snapshotId} kept no copy of volume ${name}`, {
        details: { snapshotId: snapshot.snapshotId, volume: name, included: kept },
        hint: kept.length > 0 ? `It kept copies of: ${kept.join(', ')}.` : 'Take the snapshot with "includeVolumes": true (CLI --include-volumes) to keep copies of the volumes the sandbox mounts.',
      });
    }
    return { dir: this.present(snapshot, this.disks.snapshotVolume(snapshot.snapshotId, volume.volumeId)), volume: { ...volume, usedBytes: volume.usedBytes } };
  }

  /** What a sandbox made from this full snapshot resumes from. */
  async full(snapshot: SnapshotInfo): Promise<FullSnapshot> {
    const checkpointDir = this.present(snapshot, this.disks.snapshotCheckpoint(snapshot.snapshotId));
    const contexts = await this.disks.readSnapshotFile(snapshot.snapshotId, CONTEXTS_FILE);
    return { checkpointDir, contexts: Array.isArray(contexts) ? (contexts as ContextSnapshot[]) : [] };
  }

  private async recordSize(record: SnapshotInfo): Promise<void> {
    const disk = await this.disks.snapshotSizeBytes(record.snapshotId).catch(() => undefined);
    const size = disk === undefined ? undefined : disk + (record.mode === 'full' ? await this.disks.checkpointBytes(record.snapshotId) : 0);
    const current = size === undefined ? undefined : this.store.get(record.tenantId, record.snapshotId);
    if (current && size !== undefined) this.store.upsert({ ...current, sizeBytes: size });
  }

  /** Where a sandbox made from the snapshot copies its disk from (a read-only subvolume). */
  diskOf(snapshot: SnapshotInfo): string {
    return this.present(snapshot, this.disks.snapshotDisk(snapshot.snapshotId));
  }

  /**
   * `path`, which a create, copy or changes listing from the snapshot reads; SNAPSHOT_NOT_FOUND, saying so, when
   * it is gone while its record stayed (start-up keeps records whose data is gone, with their
   * lineage): a clear error instead of btrfs's own about a missing subvolume.
   */
  private present(snapshot: SnapshotInfo, path: string): string {
    if (this.disks.present(path)) return path;
    throw new SandboxError('SNAPSHOT_NOT_FOUND', `snapshot ${snapshot.snapshotId} is listed, but its data is gone from the volume`, {
      details: { snapshotId: snapshot.snapshotId },
      hint: `Make the sandbox from another snapshot. To remove this one, kill the live sandboxes made from it (their changes are measured against it), then delete it: capsule snapshot rm ${snapshot.snapshotId} (DELETE /v1/snapshots/${snapshot.snapshotId}).`,
    });
  }

  /**
   * The tenant's snapshot, held while a sandbox is made from it (a delete meanwhile is a
   * CONFLICT); CONFLICT too while it is being deleted. `release` once the sandbox is made or not.
   */
  hold(tenantId: string, snapshotId: string): { info: SnapshotInfo; release: () => void } {
    const info = this.find(tenantId, snapshotId);
    if (this.deleting.has(`${tenantId}/${snapshotId}`)) {
      throw new SandboxError('CONFLICT', `snapshot ${snapshotId} is being deleted`, {
        details: { snapshotId },
        hint: 'Make the sandbox (or volume) from another snapshot (`capsule snapshot ls`).',
      });
    }
    this.held.set(snapshotId, (this.held.get(snapshotId) ?? 0) + 1);
    let released = false;
    const release = () => {
      if (released) return;
      released = true;
      const left = (this.held.get(snapshotId) ?? 1) - 1;
      if (left > 0) this.held.set(snapshotId, left);
      else this.held.delete(snapshotId);
    };
    return { info, release };
  }

  /**
   * Deletes the snapshot and its data. Refused (CONFLICT) while live sandboxes were made from it:
   * it is what their `changes` are measured against. `dependents` lists them.
   */
  delete(tenantId: string, snapshotId: string, dependents: readonly string[]): Promise<void> {
    // A second delete while one runs joins it: the data goes and the bytes come back once.
    return this.deleting.run(`${tenantId}/${snapshotId}`, () => this.deleteNow(tenantId, snapshotId, dependents));
  }

  private async deleteNow(tenantId: string, snapshotId: string, dependents: readonly string[]): Promise<void> {
    const record = this.find(tenantId, snapshotId);
    if (this.held.has(snapshotId)) {
      throw new SandboxError('CONFLICT', `snapshot ${snapshotId} is the origin of a sandbox or volume being made`, {
        details: { snapshotId },
        hint: 'Wait for the create (or fork, or volume copy) to finish, kill a sandbox it made, then delete the snapshot.',
      });
    }
    if (dependents.length > 0) {
      throw new SandboxError('CONFLICT', `snapshot ${snapshotId} is the origin of ${dependents.length} live sandbox${dependents.length === 1 ? '' : 'es'}`, {
        details: { snapshotId, sandboxes: [...dependents] },
        hint: 'Kill the sandboxes made from it first (their changes are measured against it), then delete it.',
      });
    }
    await this.disks.deleteSnapshot(snapshotId);
    this.store.delete(tenantId, snapshotId);
    this.budget?.releaseStored({ tenantId }, 'snapshots', record.chargedBytes ?? 0);
  }

  /**
   * At start-up: snapshot data without a record (a crash between the two) is deleted, as are the
   * read-only views a crash left. Records whose data is gone stay listed with their lineage.
   */
  async reconcile(): Promise<void> {
    const records = this.store.all();
    const known = new Set(records.map((r) => r.snapshotId));
    // Each kept snapshot counts against its tenant's quota again, as when it was taken.
    for (const record of records) this.budget?.restoreStored({ tenantId: record.tenantId }, 'snapshots', record.chargedBytes ?? 0);
    for (const id of await this.disks.listSnapshots()) if (!known.has(id)) await this.disks.deleteSnapshot(id);
    await this.disks.clearScratch();
  }
}

