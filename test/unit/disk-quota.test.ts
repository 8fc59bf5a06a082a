import { describe, expect, it } from 'vitest';
import { WorkspaceCapacity } from '../../src/engine/disk-budget.js';
import { isSandboxError, type SandboxError } from '../../src/errors/index.js';
import { volumeReserveBytes, type VolumeCapacity } from '../../src/host/volume.host.js';
import { TenantDiskQuota } from '../../src/server/disk-quota.js';
import { retryAfterSeconds } from '../../src/server/errors.js';

const MiB = 1024 * 1024;

function thrown(fn: () => unknown): SandboxError {
  try {
    fn();
  } catch (error) {
    if (isSandboxError(error)) return error;
    throw error;
  }
  throw new Error('expected a SandboxError');
}

describe('TenantDiskQuota', () => {
  it('counts workspaces, logs, artifacts and snapshots together per tenant, and names what was refused', () => {
    const quota = new TenantDiskQuota({ defaultBytes: 100 * MiB });
    const a = { tenantId: 'a' };
    quota.reserveWorkspace(a, 40 * MiB);
    quota.reserve(a, 30 * MiB); // a process's log room
    const settle = quota.reserveArtifacts(a, 20 * MiB);
    settle(10 * MiB); // the collection stored less than it planned
    quota.reserveSnapshot(a, 5 * MiB);
    expect(quota.usageOf('a')).toEqual({ workspaces: 40 * MiB, logs: 30 * MiB, artifacts: 10 * MiB, snapshots: 5 * MiB, volumes: 0, templates: 0 });
    const error = thrown(() => quota.reserveWorkspace(a, 16 * MiB));
    expect(error.code).toBe('QUOTA_EXCEEDED');
    expect(error.details).toMatchObject({ resource: 'disk', for: 'workspaces', limit: 100 * MiB, used: 85 * MiB, requested: 16 * MiB });
    expect(error.message).toMatch(/tenant a has used 85 MiB of its 100 MiB disk quota \(workspaces 40 MiB, logs 30 MiB, artifacts 10 MiB, snapshots 5 MiB\)/);
    expect(error.hint).toMatch(/--tenant-disk-quota/);
    // Another tenant is not touched by a's use.
    expect(() => quota.reserveWorkspace({ tenantId: 'b' }, 100 * MiB)).not.toThrow();
  });

  it("uses the key's own quota when the principal carries one", () => {
    const quota = new TenantDiskQuota({ defaultBytes: 10 * MiB });
    expect(() => quota.reserveWorkspace({ tenantId: 'a' }, 20 * MiB)).toThrow();
    expect(() => quota.reserveWorkspace({ tenantId: 'a', quotaBytes: 50 * MiB }, 20 * MiB)).not.toThrow();
    expect(quota.limitOf({})).toBe(10 * MiB);
  });

  it('lets a log grow only within the quota, and gives back what is released', () => {
    const quota = new TenantDiskQuota({ defaultBytes: 10 * MiB });
    const a = { tenantId: 'a', sandboxId: 's' };
    expect(quota.take(a, 8 * MiB)).toBe(true);
    expect(quota.take(a, 3 * MiB)).toBe(false);
    quota.release(a, 8 * MiB);
    expect(quota.take(a, 3 * MiB)).toBe(true);
    // What is found on disk at start counts whatever the quota.
    quota.restore(a, 20 * MiB);
    expect(quota.usageOf('a').logs).toBe(23 * MiB);
  });

  it('sets artifacts from the store without losing a collection in progress', () => {
    const quota = new TenantDiskQuota({ defaultBytes: 100 * MiB });
    const settle = quota.reserveArtifacts({ tenantId: 'a' }, 10 * MiB);
    quota.setStoredArtifacts(new Map([['a', 30 * MiB]]));
    expect(quota.usageOf('a').artifacts).toBe(40 * MiB);
    settle(10 * MiB);
    quota.setStoredArtifacts(new Map()); // every artifact expired
    expect(quota.usageOf('a').artifacts).toBe(0);
  });

  it('charges volumes and template layers, names what to delete, and takes template use from the store', () => {
    const quota = new TenantDiskQuota({ defaultBytes: 100 * MiB });
    const a = { tenantId: 'a' };
    quota.reserveStored(a, 'volumes', 50 * MiB);
    quota.reserveStored(a, 'snapshots', 10 * MiB);
    quota.setTemplates(new Map([['a', 30 * MiB]]));
    expect(quota.roomOf(a)).toBe(10 * MiB);
    const error = thrown(() => quota.reserveStored(a, 'templates', 11 * MiB));
    expect(error.code).toBe('QUOTA_EXCEEDED');
    expect(error.details).toMatchObject({ for: 'templates', used: 90 * MiB, requested: 11 * MiB });
    expect(error.message).toMatch(/\(snapshots 10 MiB, volumes 50 MiB, templates 30 MiB\); templates need 11 MiB more/);
    // The largest use first: volumes, then templates, then snapshots.
    expect(error.hint).toMatch(/delete volumes .*; remove templates you built .*; delete snapshots/);
    quota.releaseStored(a, 'volumes', 50 * MiB);
    expect(() => quota.reserveStored(a, 'templates', 11 * MiB)).not.toThrow();
    // What the store holds replaces the running total (a removal freed the build's layers).
    quota.setTemplates(new Map());
    expect(quota.usageOf('a').templates).toBe(0);
    // Restored at start-up whatever the quota.
    quota.restoreStored(a, 'volumes', 500 * MiB);
    expect(quota.roomOf(a)).toBe(0);
    expect(quota.roomOf({ tenantId: 'b' })).toBe(100 * MiB);
  });

  it('refuses a quota that is not a positive number of bytes', () => {
    expect(thrown(() => new TenantDiskQuota({ defaultBytes: 0 })).code).toBe('INVALID_ARGUMENT');
  });
});

describe('WorkspaceCapacity', () => {
  const capacity = (usableBytes: number, backableBytes = usableBytes): VolumeCapacity => ({ sizeBytes: usableBytes, usableBytes, backableBytes });
  const ledger = (overcommit?: number, held = 0) => new WorkspaceCapacity({ measure: () => Promise.resolve(capacity(0)), overcommit, heldBytes: () => held });

  it('promises no more than the volume can back, and takes promises back once', () => {
    const volume = ledger();
    const release = volume.reserve(60 * MiB, capacity(100 * MiB));
    const error = thrown(() => volume.reserve(50 * MiB, capacity(100 * MiB)));
    expect(error.code).toBe('CAPACITY_EXHAUSTED');
    expect(error.status).toBe(503);
    expect(error.details).toMatchObject({ resource: 'workspace_volume', limitBytes: 100 * MiB, usedBytes: 60 * MiB, requestedBytes: 50 * MiB, retryAfterS: 30 });
    expect(retryAfterSeconds(error)).toBe(30);
    release();
    release();
    expect(volume.committedBytes).toBe(0);
    expect(() => volume.reserve(100 * MiB, capacity(100 * MiB))).not.toThrow();
  });

  it('is bound by the host filesystem under the image, counts the warm pool, and loosens only by the operator ratio', () => {
    expect(thrown(() => ledger().reserve(60 * MiB, capacity(100 * MiB, 50 * MiB))).message).toMatch(/host filesystem/);
    expect(thrown(() => ledger(1, 50 * MiB).reserve(60 * MiB, capacity(100 * MiB))).details).toMatchObject({ usedBytes: 50 * MiB });
    expect(() => ledger(2).reserve(150 * MiB, capacity(100 * MiB))).not.toThrow();
    expect(thrown(() => ledger(0.5)).code).toBe('INVALID_ARGUMENT');
  });

  it("keeps btrfs's own room out of what workspaces may be promised", () => {
    expect(volumeReserveBytes(320 * MiB)).toBe(128 * MiB);
    expect(volumeReserveBytes(32 * 1024 * MiB)).toBe(Math.ceil((32 * 1024 * MiB) / 10));
  });
});
