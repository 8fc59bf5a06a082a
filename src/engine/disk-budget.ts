import { SandboxError } from '../errors/index.js';
import type { VolumeCapacity } from '../host/volume.host.js';
import { formatBytes } from '../sandbox-spec/index.js';

/** Who a sandbox's disk is charged to: its tenant, under the quota of the key that created it. */
export interface DiskOwner {
  tenantId: string;
  /** The creating key's disk quota. @default the operator's quota for every tenant */
  quotaBytes?: number;
}

/**
 * Where tenants' workspaces are charged: the server's per-tenant disk quota
 * (src/server/disk-quota.ts, which also counts process logs, artifacts and snapshots). A
 * workspace counts by its disk limit, which is what it may use.
 */
export interface WorkspaceBudget {
  /**
   * Before a workspace is made: throws QUOTA_EXCEEDED when `diskBytes` more do not fit the
   * owner's quota, else charges them. Synchronous, so concurrent creates cannot overshoot.
   */
  reserveWorkspace(owner: DiskOwner, diskBytes: number): void;
  releaseWorkspace(owner: DiskOwner, diskBytes: number): void;
  /** A workspace that is there already (a sandbox recovered at start-up): charged whatever the quota. */
  restoreWorkspace(owner: DiskOwner, diskBytes: number): void;
}

/** What else of a tenant's stays on the volume: snapshots, volumes and template layers. */
export type StoredResource = 'snapshots' | 'volumes' | 'templates';

/**
 * The tenant disk quota as the engine and the template service charge it (the server's
 * TenantDiskQuota): workspaces, and what outlives sandboxes — a snapshot by the bytes its sandbox
 * had written beyond its origin when it was taken, a volume by its size limit, a template layer
 * by the bytes its build step added.
 */
export interface DiskBudget extends WorkspaceBudget {
  /** Before the thing is made: QUOTA_EXCEEDED when `bytes` more do not fit, else charges them. Synchronous. */
  reserveStored(owner: DiskOwner, resource: StoredResource, bytes: number): void;
  releaseStored(owner: DiskOwner, resource: StoredResource, bytes: number): void;
  /** What exists already (at start-up): charged whatever the quota. */
  restoreStored(owner: DiskOwner, resource: StoredResource, bytes: number): void;
}

export interface WorkspaceCapacityOptions {
  /** What the volume can back now (WorkspaceVolume.capacity). */
  measure: () => Promise<VolumeCapacity>;
  /**
   * How far the disk limits of live workspaces may exceed what the volume can back: 1 never
   * promises more than it has (a full workspace can never make another's writes fail); 2 lets
   * limits add up to twice the volume. @default 1
   */
  overcommit?: number;
  /** Disk limits held outside the ledger (the warm pool's workspaces). @default 0 */
  heldBytes?: () => number;
}

const RETRY_AFTER_S = 30;

/**
 * The workspace volume's promises: the disk limits of live sandboxes, which must fit what the
 * volume (and the host filesystem under its sparse image) can back. A create that does not fit
 * is refused with CAPACITY_EXHAUSTED before anything is made, rather than letting workspaces
 * together outgrow the volume, where one tenant filling its workspace would fail another's writes.
 */
export class WorkspaceCapacity {
  private committed = 0;
  private readonly overcommit: number;

  constructor(private readonly options: WorkspaceCapacityOptions) {
    this.overcommit = options.overcommit ?? 1;
    if (!(this.overcommit >= 1)) {
      throw new SandboxError('INVALID_ARGUMENT', `the disk overcommit ratio must be 1 or more, not ${this.overcommit}`, {
        details: { field: 'overcommit', value: this.overcommit },
        hint: 'Use 1 (never promise more than the volume holds) or a larger ratio.',
      });
    }
  }

  /** Disk limits promised to live workspaces (the warm pool's included). */
  get committedBytes(): number {
    return this.committed + (this.options.heldBytes?.() ?? 0);
  }

  measure(): Promise<VolumeCapacity> {
    return this.options.measure();
  }

  /** The volume's promises against `capacity` (measured just before), for GET /v1/capacity. */
  describe(capacity: VolumeCapacity): { limitBytes: number; committedBytes: number; freeBytes: number; overcommit: number } {
    const limitBytes = this.limitOf(capacity);
    const committedBytes = this.committedBytes;
    return { limitBytes, committedBytes, freeBytes: Math.max(0, limitBytes - committedBytes), overcommit: this.overcommit };
  }

  /**
   * Promises `diskBytes` more against `capacity` (measured just before) or throws
   * CAPACITY_EXHAUSTED. Synchronous; returns the release, to call once when the workspace goes.
   */
  reserve(diskBytes: number, capacity: VolumeCapacity): () => void {
    const limit = this.limitOf(capacity);
    const used = this.committedBytes;
    if (used + diskBytes > limit) {
      const hostBound = capacity.backableBytes < capacity.usableBytes ? ' (the host filesystem under the volume is the bound)' : '';
      throw new SandboxError('CAPACITY_EXHAUSTED', `the workspace volume cannot back ${formatBytes(diskBytes)} more: ${formatBytes(used)} of its ${formatBytes(limit)} are promised to live sandboxes${hostBound}`, {
        details: { resource: 'workspace_volume', limitBytes: limit, usedBytes: used, requestedBytes: diskBytes, overcommit: this.overcommit, retryAfterS: RETRY_AFTER_S },
        hint: 'Retry once sandboxes have ended (see Retry-After), or ask for a smaller limits.diskBytes; the operator can grow the volume or allow overcommit (capsule serve --disk-overcommit).',
      });
    }
    return this.restore(diskBytes);
  }

  private limitOf(capacity: VolumeCapacity): number {
    return Math.floor(Math.min(capacity.usableBytes, capacity.backableBytes) * this.overcommit);
  }

  /** Counts a workspace that exists already (recovered at start-up), whatever the capacity. */
  restore(diskBytes: number): () => void {
    this.committed += diskBytes;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.committed -= diskBytes;
    };
  }
}
