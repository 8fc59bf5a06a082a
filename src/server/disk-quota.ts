import { SandboxError } from '../errors/index.js';
import type { DiskBudget, DiskOwner } from '../engine/disk-budget.js';
import type { LogDiskBudget } from '../engine/process-logs.js';
import { formatBytes } from '../sandbox-spec/index.js';

/** What a tenant's disk quota counts. */
export const DISK_RESOURCES = ['workspaces', 'logs', 'artifacts', 'snapshots', 'volumes', 'templates'] as const;
export type DiskResource = (typeof DISK_RESOURCES)[number];
export type DiskUsage = Record<DiskResource, number>;

/** Each tenant's disk quota unless its key says otherwise. */
export const DEFAULT_TENANT_DISK_QUOTA_BYTES = 20 * 1024 ** 3;

const empty = (): DiskUsage => ({ workspaces: 0, logs: 0, artifacts: 0, snapshots: 0, volumes: 0, templates: 0 });

/** What to delete to free each resource, for a refusal's hint. */
const HOW_TO_FREE: Record<DiskResource, string> = {
  workspaces: 'kill sandboxes you no longer need (each counts by its limits.diskBytes)',
  logs: 'the logs of an ended sandbox go an hour after it ends',
  artifacts: 'delete artifacts (DELETE /v1/artifacts/{sha256})',
  snapshots: 'delete snapshots (capsule snapshot rm, DELETE /v1/snapshots/{id})',
  volumes: 'delete volumes (capsule volume rm, DELETE /v1/volumes/{name}; each counts by its size)',
  templates: 'remove templates you built (capsule template rm, DELETE /v1/templates/{ref}: their layers go with them)',
};

/**
 * Each tenant's disk quota over its workspaces (counted by their disk limits: what they may
 * use), its processes' logs, its artifacts, its snapshots (what each held beyond its origin when
 * taken), its volumes (by their size limits) and the template layers its builds added. Usage is
 * kept as running totals, charged where the disk is taken and given back where it is freed, and
 * set from disk at start (logs, artifacts, template layers) and from the records (workspaces,
 * snapshots, volumes). Work past the quota is refused with QUOTA_EXCEEDED naming what it was
 * for, the quota, the use and what to delete.
 *
 * The quota applies per tenant; its size comes from the key acting (`Principal.diskQuotaBytes`,
 * the key's grant, when present) or the operator's default. A sandbox's later work (its
 * processes' logs) is charged under the quota it was created with.
 */
export class TenantDiskQuota implements DiskBudget, LogDiskBudget {
  readonly defaultBytes: number;
  private readonly usage = new Map<string, DiskUsage>();
  /** Bytes the artifact store holds per tenant (set from the store), apart from collections in progress. */
  private readonly storedArtifacts = new Map<string, number>();

  constructor(options: { defaultBytes?: number } = {}) {
    this.defaultBytes = options.defaultBytes ?? DEFAULT_TENANT_DISK_QUOTA_BYTES;
    if (!(Number.isSafeInteger(this.defaultBytes) && this.defaultBytes > 0)) {
      throw new SandboxError('INVALID_ARGUMENT', `the tenant disk quota must be a positive number of bytes, not ${this.defaultBytes}`, {
        details: { field: 'tenantDiskQuotaBytes', value: this.defaultBytes },
        hint: 'Pass a size such as --tenant-disk-quota 20GiB.',
      });
    }
  }

  /** The quota of `owner`: its key's when it has one, else the operator's default. */
  limitOf(owner: { quotaBytes?: number }): number {
    return owner.quotaBytes ?? this.defaultBytes;
  }

  /** What the tenant uses now, by resource. */
  usageOf(tenantId: string): DiskUsage {
    return { ...(this.usage.get(tenantId) ?? empty()) };
  }

  /** Bytes the owner may still use. */
  roomOf(owner: DiskOwner): number {
    const usage = this.usageOf(owner.tenantId);
    return Math.max(0, this.limitOf(owner) - DISK_RESOURCES.reduce((sum, r) => sum + usage[r], 0));
  }

  /** Throws QUOTA_EXCEEDED unless `bytes` more for `resource` fit the owner's quota. */
  check(owner: DiskOwner, resource: DiskResource, bytes: number): void {
    const usage = this.usageOf(owner.tenantId);
    const used = DISK_RESOURCES.reduce((sum, r) => sum + usage[r], 0);
    const limit = this.limitOf(owner);
    if (used + bytes <= limit) return;
    const parts = DISK_RESOURCES.filter((r) => usage[r] > 0 || r === resource).map((r) => `${r} ${formatBytes(usage[r])}`).join(', ');
    // What to delete, the largest use first.
    const frees = DISK_RESOURCES.filter((r) => usage[r] > 0 && r !== 'logs')
      .sort((x, y) => usage[y] - usage[x])
      .map((r) => HOW_TO_FREE[r]);
    throw new SandboxError('QUOTA_EXCEEDED', `tenant ${owner.tenantId} has used ${formatBytes(used)} of its ${formatBytes(limit)} disk quota (${parts}); ${resource} need ${formatBytes(bytes)} more`, {
      details: { resource: 'disk', for: resource, unit: 'bytes', limit, used, requested: bytes, usage },
      hint:
        `Free disk: ${[...frees, HOW_TO_FREE.logs].join('; ')}. ` +
        "The operator sets the quota: capsule serve --tenant-disk-quota, or a key's diskQuotaBytes.",
    });
  }

  // Workspaces (the engine, WorkspaceBudget).

  reserveWorkspace(owner: DiskOwner, diskBytes: number): void {
    this.check(owner, 'workspaces', diskBytes);
    this.add(owner.tenantId, 'workspaces', diskBytes);
  }

  releaseWorkspace(owner: DiskOwner, diskBytes: number): void {
    this.add(owner.tenantId, 'workspaces', -diskBytes);
  }

  restoreWorkspace(owner: DiskOwner, diskBytes: number): void {
    this.add(owner.tenantId, 'workspaces', diskBytes);
  }

  // Process logs (the engine's ProcessLogs, LogDiskBudget).

  reserve(owner: DiskOwner, bytes: number): void {
    this.check(owner, 'logs', bytes);
    this.add(owner.tenantId, 'logs', bytes);
  }

  take(owner: DiskOwner, bytes: number): boolean {
    try {
      this.check(owner, 'logs', bytes);
    } catch {
      return false; // the log stops growing; what it dropped is counted and flagged there
    }
    this.add(owner.tenantId, 'logs', bytes);
    return true;
  }

  release(owner: DiskOwner, bytes: number): void {
    this.add(owner.tenantId, 'logs', -bytes);
  }

  restore(owner: DiskOwner, bytes: number): void {
    this.add(owner.tenantId, 'logs', bytes);
  }

  // Artifacts (the collect route; the store is read at start and after each sweep).

  /**
   * Room for a collection of `bytes` (its planned files) or QUOTA_EXCEEDED; the returned function
   * settles it with what was stored.
   */
  reserveArtifacts(owner: DiskOwner, bytes: number): (storedBytes: number) => void {
    this.check(owner, 'artifacts', bytes);
    this.add(owner.tenantId, 'artifacts', bytes);
    let settled = false;
    return (storedBytes) => {
      if (settled) return;
      settled = true;
      this.add(owner.tenantId, 'artifacts', storedBytes - bytes);
      this.storedArtifacts.set(owner.tenantId, (this.storedArtifacts.get(owner.tenantId) ?? 0) + storedBytes);
    };
  }

  /** What the artifact store holds for each tenant, read from it (at start, after a sweep or a delete). */
  setStoredArtifacts(bytesByTenant: ReadonlyMap<string, number>, tenantIds: Iterable<string> = this.usage.keys()): void {
    for (const tenantId of new Set([...tenantIds, ...bytesByTenant.keys()])) {
      const stored = bytesByTenant.get(tenantId) ?? 0;
      this.add(tenantId, 'artifacts', stored - (this.storedArtifacts.get(tenantId) ?? 0));
      this.storedArtifacts.set(tenantId, stored);
    }
  }

  // Snapshots, volumes and template layers (the engine and the template service, DiskBudget).

  reserveStored(owner: DiskOwner, resource: 'snapshots' | 'volumes' | 'templates', bytes: number): void {
    this.check(owner, resource, bytes);
    this.add(owner.tenantId, resource, bytes);
  }

  releaseStored(owner: DiskOwner, resource: 'snapshots' | 'volumes' | 'templates', bytes: number): void {
    this.add(owner.tenantId, resource, -bytes);
  }

  restoreStored(owner: DiskOwner, resource: 'snapshots' | 'volumes' | 'templates', bytes: number): void {
    this.add(owner.tenantId, resource, bytes);
  }

  /** Room for a snapshot's images of `bytes`, or QUOTA_EXCEEDED. */
  reserveSnapshot(owner: DiskOwner, bytes: number): void {
    this.reserveStored(owner, 'snapshots', bytes);
  }

  releaseSnapshot(owner: DiskOwner, bytes: number): void {
    this.releaseStored(owner, 'snapshots', bytes);
  }

  /**
   * What each tenant's template layers hold, read off the layer store (at start, before each build
   * and after a build or removal): replaces the running total, builds in progress included.
   */
  setTemplates(bytesByTenant: ReadonlyMap<string, number>, tenantIds: Iterable<string> = this.usage.keys()): void {
    for (const tenantId of new Set([...tenantIds, ...bytesByTenant.keys()])) {
      const usage = this.usage.get(tenantId);
      const bytes = bytesByTenant.get(tenantId) ?? 0;
      if (usage) usage.templates = bytes;
      else if (bytes > 0) this.usage.set(tenantId, { ...empty(), templates: bytes });
    }
  }

  private add(tenantId: string, resource: DiskResource, bytes: number): void {
    let usage = this.usage.get(tenantId);
    if (!usage) this.usage.set(tenantId, (usage = empty()));
    usage[resource] = Math.max(0, usage[resource] + bytes);
  }
}
