import { SandboxError } from '../errors/index.js';
import type { SandboxSpec } from '../sandbox-spec/index.js';
import type { StoredDisks } from '../host/stored-disks.host.js';
import type { VolumeRecordStore } from '../store/volume-records.js';
import type { CreateVolumeInput, SandboxInfo, SnapshotVolume, VolumeInfo } from '../wire/index.js';
import type { DiskBudget } from './disk-budget.js';
import { InFlight } from './in-flight.js';
import { newSandboxId } from './ids.js';
import { hasTemplateRoot } from './templates.js';

/**
 * Named volumes: per tenant, each a btrfs subvolume under `volumes/<id>` bounded by its own quota
 * group, that outlives sandboxes and server restarts. A sandbox mounts them by name
 * (`spec.volumes`); one sandbox at a time may write a volume unless it was created `shared`.
 */
export class Volumes {
  private readonly deleting = new InFlight();

  constructor(
    private readonly disks: StoredDisks,
    private readonly store: VolumeRecordStore,
    private readonly now: () => number,
    /** Where each volume's size limit is charged to its tenant's disk quota. @default nothing is charged */
    private readonly budget?: DiskBudget,
  ) {}

  /**
   * A new volume, empty or (`copy`) a writable copy of one a snapshot kept; its size limit is
   * charged to the tenant's disk quota (QUOTA_EXCEEDED, before anything is made) under
   * `owner.quotaBytes`, the creating key's quota. A copy's size defaults to its volume's then
   * and holds what the copy held: under simple quotas the copy's bytes stay charged to the
   * volume that wrote them, so its own quota limit is the size less those bytes, and it never
   * holds more than its size in either mode (decision 022).
   */
  async create(
    tenantId: string,
    input: Omit<CreateVolumeInput, 'from'>,
    owner: { quotaBytes?: number } = {},
    copy?: { snapshotId: string; dir: string; volume: SnapshotVolume & { usedBytes: number } },
  ): Promise<VolumeInfo> {
    const sizeBytes = input.sizeBytes ?? copy?.volume.sizeBytes;
    if (sizeBytes === undefined) throw new SandboxError('INVALID_ARGUMENT', 'a volume needs sizeBytes', { details: { field: 'sizeBytes' }, hint: 'Give "sizeBytes" (at least 1 MiB).' });
    // In either mode it must hold the copy and 1 MiB more: under full quota groups a limit below
    // what a volume already holds stops its writes but keeps the bytes, charged as the smaller size.
    if (copy && sizeBytes - copy.volume.usedBytes < 1024 * 1024) {
      const atLeast = copy.volume.usedBytes + 1024 * 1024;
      throw new SandboxError('INVALID_ARGUMENT', `volume ${input.name} of ${sizeBytes} bytes cannot hold the ${copy.volume.usedBytes} bytes of the copy with room to write`, {
        details: { field: 'sizeBytes', sizeBytes, copyBytes: copy.volume.usedBytes },
        hint: `Give "sizeBytes" of at least ${atLeast} (the copy's bytes and 1 MiB).`,
      });
    }
    const simple = copy !== undefined && (await this.disks.accounting()) === 'simple';
    const limitBytes = copy && simple ? sizeBytes - copy.volume.usedBytes : sizeBytes;
    const info: VolumeInfo = {
      volumeId: `vol_${newSandboxId()}`,
      tenantId,
      name: input.name,
      sizeBytes,
      shared: input.shared === true,
      createdAt: new Date(this.now()).toISOString(),
      ...(copy ? { origin: { snapshotId: copy.snapshotId, volume: copy.volume.name, bytes: copy.volume.usedBytes } } : {}),
    };
    const charged = { tenantId, ...(owner.quotaBytes !== undefined ? { quotaBytes: owner.quotaBytes } : {}) };
    this.budget?.reserveStored(charged, 'volumes', info.sizeBytes);
    if (!this.store.insert(info)) {
      this.budget?.releaseStored(charged, 'volumes', info.sizeBytes);
      throw new SandboxError('ALREADY_EXISTS', `volume ${input.name} already exists`, {
        details: { volume: input.name },
        hint: 'Choose another name, or use the existing volume (`capsule volume ls`).',
      });
    }
    try {
      if (copy) await this.disks.createVolumeFrom(info.volumeId, copy.dir, limitBytes);
      else await this.disks.createVolume(info.volumeId, info.sizeBytes);
    } catch (error) {
      this.store.delete(tenantId, info.name);
      this.budget?.releaseStored(charged, 'volumes', info.sizeBytes);
      throw error;
    }
    return info;
  }

  find(tenantId: string, name: string): VolumeInfo {
    const record = this.store.get(tenantId, name);
    if (!record) {
      throw new SandboxError('VOLUME_NOT_FOUND', `volume ${name} not found`, {
        details: { volume: name },
        hint: 'List your volumes with `capsule volume ls` (GET /v1/volumes); create one with `capsule volume create NAME --size 1GiB`.',
      });
    }
    return record;
  }

  /** The volume with what it holds now, by name or by volume id (E2B's handle for it). */
  async describe(tenantId: string, key: string, by: 'name' | 'id' = 'name'): Promise<VolumeInfo> {
    return this.withUsage(by === 'name' ? this.find(tenantId, key) : this.findById(tenantId, key));
  }

  private findById(tenantId: string, volumeId: string): VolumeInfo {
    const record = this.store.list(tenantId).find((info) => info.volumeId === volumeId);
    if (!record) {
      throw new SandboxError('VOLUME_NOT_FOUND', `volume ${volumeId} not found`, {
        details: { volumeId },
        hint: 'List your volumes (GET /v1/volumes, Volume.list() in the E2B SDK); volumes of other tenants are not visible.',
      });
    }
    return record;
  }

  async list(tenantId: string): Promise<VolumeInfo[]> {
    return Promise.all(this.store.list(tenantId).map((info) => this.withUsage(info)));
  }

  /** Deletes the volume and its data; CONFLICT while a live sandbox mounts it. */
  /**
   * Deletes the volume (by name, or `by: 'id'`, E2B's handle) and its data; CONFLICT while a
   * live sandbox mounts it. By id, a volume made since under the same name is not this one.
   */
  delete(tenantId: string, key: string, live: readonly SandboxInfo[], by: 'name' | 'id' = 'name'): Promise<void> {
    const name = by === 'name' ? key : this.findById(tenantId, key).name;
    // A second delete while one runs joins it: the data goes and the bytes come back once.
    return this.deleting.run(`${tenantId}/${name}`, () => this.deleteNow(tenantId, name, live, by === 'id' ? key : undefined));
  }

  private async deleteNow(tenantId: string, name: string, live: readonly SandboxInfo[], volumeId?: string): Promise<void> {
    const info = volumeId === undefined ? this.find(tenantId, name) : this.findById(tenantId, volumeId);
    const users = live.filter((s) => s.tenantId === tenantId && s.spec.volumes.some((v) => v.name === name)).map((s) => s.sandboxId);
    if (users.length > 0) {
      throw new SandboxError('CONFLICT', `volume ${name} is mounted by ${users.length} live sandbox${users.length === 1 ? '' : 'es'}`, {
        details: { volume: name, sandboxes: users },
        hint: 'Kill the sandboxes that mount it first, then delete it.',
      });
    }
    await this.disks.deleteVolume(info.volumeId);
    this.store.delete(tenantId, name);
    this.budget?.releaseStored({ tenantId }, 'volumes', info.sizeBytes);
  }

  /**
   * The host directories of the spec's volumes, checked for the tenant: each must exist, and one
   * mounted writable must not be mounted writable by another live sandbox unless it is shared.
   */
  resolve(tenantId: string, spec: SandboxSpec, live: readonly SandboxInfo[]): string[] {
    return spec.volumes.map((mount, index) => {
      const info = this.find(tenantId, mount.name);
      if (this.deleting.has(`${tenantId}/${mount.name}`)) {
        throw new SandboxError('CONFLICT', `volume ${mount.name} is being deleted`, {
          details: { field: `volumes[${index}]`, volume: mount.name },
          hint: 'Create the volume again once its delete is done, or mount another one.',
        });
      }
      if (!mount.readOnly) {
        // A host-template sandbox has one uid of its own: the volume is lent to it while it
        // writes, so two of them cannot write one volume at once even when it is shared.
        const hostTemplate = !hasTemplateRoot(spec.template);
        const writer = live.find(
          (s) =>
            s.tenantId === tenantId &&
            s.spec.volumes.some((v) => v.name === mount.name && !v.readOnly) &&
            (!info.shared || (hostTemplate && !hasTemplateRoot(s.spec.template))),
        );
        if (writer) {
          throw new SandboxError('CONFLICT', `volume ${mount.name} is mounted writable by sandbox ${writer.sandboxId}`, {
            details: { field: `volumes[${index}]`, volume: mount.name, sandboxId: writer.sandboxId, shared: info.shared },
            hint: info.shared
              ? 'Sandboxes of the host template write a volume one at a time (each has its own uid); mount it read-only, or use sandboxes from a template to share writes.'
              : 'Mount it read-only ("readOnly": true, CLI NAME:/path:ro), end the other sandbox, or create the volume with "shared": true.',
          });
        }
      }
      return this.disks.volumePath(info.volumeId);
    });
  }

  /**
   * At start-up, after the live sandboxes came back (`live`): volume data without a record (a
   * crash between the two) goes,
   * and a volume still lent to a host-template sandbox that did not come back (its record was
   * unreadable, its supervisor gone) is given back to the stored user, so that the next sandbox
   * to mount it, of either kind, can write it.
   */
  async reconcile(live: readonly SandboxInfo[]): Promise<void> {
    const records = this.store.all();
    const known = new Set(records.map((r) => r.volumeId));
    for (const record of records) this.budget?.restoreStored({ tenantId: record.tenantId }, 'volumes', record.sizeBytes);
    for (const id of await this.disks.listVolumes()) if (!known.has(id)) await this.disks.deleteVolume(id);
    for (const record of records) {
      const lentTo = live.some((s) => s.tenantId === record.tenantId && !hasTemplateRoot(s.spec.template) && s.spec.volumes.some((v) => v.name === record.name && !v.readOnly));
      if (lentTo) continue;
      // Not a reason to refuse to start: the volume stays lent, and the next host-template
      // sandbox that mounts it takes it over as before.
      await this.disks.returnIfLent(record.volumeId).catch((error: Error) => {
        process.stderr.write(`capsule: volume ${record.name} of tenant ${record.tenantId} could not be given back to the stored user: ${error.message}\n`);
      });
    }
  }

  /** With what it holds: its quota group's count, plus under simple quotas the bytes it was copied with (at most). */
  private async withUsage(info: VolumeInfo): Promise<VolumeInfo> {
    const used = await this.disks.volumeUsedBytes(info.volumeId).catch(() => undefined);
    if (used === undefined) return info;
    const inherited = info.origin && (await this.disks.accounting()) === 'simple' ? info.origin.bytes : 0;
    return { ...info, usedBytes: used + inherited };
  }
}
