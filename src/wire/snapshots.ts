import { z } from 'zod';
import { SandboxSpecSchema, VOLUME_NAME } from '../sandbox-spec/index.js';
import { SandboxInfoSchema } from './sandbox.js';
import { SANDBOX_ID_PATTERN } from './common.js';
import { INTERPRETER_LANGUAGES } from './constants.js';

/** Snapshot ids: `snap_` and 20 lowercase base-32 characters (safe in paths and URLs). */
export const SNAPSHOT_ID_PATTERN = /^snap_[a-z2-7]{20}$/;

export const SNAPSHOT_MODES = ['filesystem', 'full'] as const;

/** One of a sandbox's volume mounts as its snapshot records it, and whether a copy was kept. */
export const SnapshotVolumeSchema = z.object({
  name: z.string(),
  volumeId: z.string(),
  path: z.string(),
  readOnly: z.boolean(),
  /** Whether the snapshot keeps a copy of the volume, taken at the instant of its disk (`includeVolumes`). */
  included: z.boolean(),
  /** The volume's size limit then: a volume made from the copy gets it unless told otherwise. */
  sizeBytes: z.number().int().positive(),
  /** Included: the bytes the copy holds, charged to the tenant with the snapshot. */
  usedBytes: z.number().int().nonnegative().optional(),
});
export type SnapshotVolume = z.infer<typeof SnapshotVolumeSchema>;

/** A read-only copy of a sandbox's root and workspace, owned by one tenant. */
export const SnapshotInfoSchema = z.object({
  snapshotId: z.string(),
  tenantId: z.string(),
  name: z.string().optional(),
  mode: z.enum(SNAPSHOT_MODES),
  /** Lineage: the sandbox it was taken of, the snapshot that sandbox came from, its template. */
  sandboxId: z.string(),
  parentSnapshotId: z.string().optional(),
  template: z.string(),
  backend: z.string(),
  /** `root`: a template sandbox's whole root (its /workspace inside); `workspace`: the host template's workspace. */
  disk: z.enum(['root', 'workspace']),
  /**
   * Bytes the snapshot holds: on a volume with simple quotas (decision 022) its charge, what it
   * keeps beyond its template; on an older volume its quota group's referenced bytes, counted
   * just after it is taken, absent until then.
   */
  sizeBytes: z.number().int().nonnegative().optional(),
  /**
   * What the snapshot counts against the tenant's disk quota: the bytes its sandbox's disk had
   * written at the instant it was taken, as that disk's limit counts them, plus the charge of the
   * snapshot the sandbox was made from (its data is kept here too), plus a `full` snapshot's
   * checkpoint image. Absent on snapshots taken before quotas counted them (then 0).
   */
  chargedBytes: z.number().int().nonnegative().optional(),
  createdAt: z.string(),
  /** The source sandbox's spec: a sandbox made from the snapshot starts with it unless told otherwise. */
  spec: SandboxSpecSchema,
  /**
   * The source's volume mounts, each with whether the snapshot kept a copy (`includeVolumes`). A
   * sandbox made from the snapshot mounts the live volumes its spec names; a copy becomes a volume
   * of its own with `POST /v1/volumes {from}`. Absent on snapshots taken before volumes were recorded.
   */
  volumes: z.array(SnapshotVolumeSchema).optional(),
  /**
   * Mode `full`: what its checkpoint keeps besides the disk: the processes that resume in every
   * sandbox made from it, among them the drivers of these interpreter contexts (same ids there).
   */
  checkpoint: z
    .object({
      processCount: z.number().int().nonnegative(),
      contexts: z.array(z.object({ id: z.string(), language: z.enum(INTERPRETER_LANGUAGES) })),
    })
    .optional(),
});
export type SnapshotInfo = z.infer<typeof SnapshotInfoSchema>;

export const SnapshotIdParams = z.strictObject({ snapshotId: z.string().regex(SNAPSHOT_ID_PATTERN, 'must be a snapshot id (snap_...)') });

export const SnapshotName = z.string().min(1).max(128).regex(/^[^\0/]+$/, 'must not contain "/" or NUL');

export const CreateSnapshotBody = z.strictObject({
  name: SnapshotName.optional(),
  mode: z.enum(SNAPSHOT_MODES).optional().meta({ description: '`filesystem` (default): root and workspace, the sandbox frozen for the instant. `full`: processes and memory too, where the backend can.' }),
  includeVolumes: z.boolean().optional().meta({
    description: 'Also keep a copy of each volume the sandbox mounts, taken at the same instant and charged with the snapshot (default false: volumes are not part of a snapshot). The answer\'s `volumes` says which were included; `POST /v1/volumes {from}` makes a volume of a copy.',
  }),
});

export const SnapshotListSchema = z.object({ snapshots: z.array(SnapshotInfoSchema) });

export const MAX_FORKS = 100;

export const ForkBody = z.strictObject({
  count: z.number().int().min(1).max(MAX_FORKS),
  mode: z.enum(SNAPSHOT_MODES).optional().meta({ description: '`filesystem` (default): each fork starts fresh processes on a copy of the files. `full` (gVisor): each fork resumes the source\'s processes and memory.' }),
  metadata: z.record(z.string(), z.string()).optional(),
});

/** One fork: its sandbox, or why it could not be made. */
export const ForkEntrySchema = z.union([
  z.object({ sandbox: SandboxInfoSchema }),
  z.object({ error: z.object({ code: z.string(), message: z.string() }) }),
]);

export const ForkResultSchema = z.object({
  /** The one snapshot every fork was made from (their origin for `changes`). */
  snapshot: SnapshotInfoSchema,
  forks: z.array(ForkEntrySchema),
});
export type ForkResult = z.infer<typeof ForkResultSchema>;

// ---- volumes

/** A named volume of a tenant: a quota'd directory that outlives sandboxes and server restarts. */
export const VolumeInfoSchema = z.object({
  volumeId: z.string(),
  tenantId: z.string(),
  name: z.string(),
  /** Its size limit (a btrfs quota group). */
  sizeBytes: z.number().int().positive(),
  /** Whether more than one sandbox may mount it writable at once. */
  shared: z.boolean(),
  /** Bytes it holds now, when the kernel said. */
  usedBytes: z.number().int().nonnegative().optional(),
  createdAt: z.string(),
  /** Made from a snapshot's copy of a volume: which, and the bytes the copy held. */
  origin: z.object({ snapshotId: z.string(), volume: z.string(), bytes: z.number().int().nonnegative() }).optional(),
});
export type VolumeInfo = z.infer<typeof VolumeInfoSchema>;

export const VolumeNameParams = z.strictObject({ name: z.string().regex(VOLUME_NAME, 'must be a volume name') });

export const CreateVolumeBody = z
  .strictObject({
    name: z.string().regex(VOLUME_NAME, 'must be a volume name (lowercase letters, digits, "._-", at most 63)'),
    sizeBytes: z.number().int().min(1024 * 1024).max(2 ** 50).optional().meta({ description: 'Its size limit. Required, unless `from` is given: then the copied volume\'s size.' }),
    shared: z.boolean().optional().meta({ description: 'Let several sandboxes mount it writable at once (default: one writer at a time).' }),
    from: z
      .strictObject({
        snapshotId: z.string().regex(SNAPSHOT_ID_PATTERN, 'must be a snapshot id (snap_...)'),
        volume: z.string().regex(VOLUME_NAME, 'must be a volume name'),
      })
      .optional()
      .meta({ description: 'Start as a copy of the volume named `volume` that snapshot `snapshotId` kept (taken with `includeVolumes`).' }),
  })
  .refine((body) => body.sizeBytes !== undefined || body.from !== undefined, { message: 'sizeBytes is required unless the volume is made from a snapshot\'s copy (from)', path: ['sizeBytes'] });
export type CreateVolumeInput = z.infer<typeof CreateVolumeBody>;

export const VolumeListSchema = z.object({ volumes: z.array(VolumeInfoSchema) });

// ---- changes

export const ChangeSchema = z.object({
  /** As the sandbox sees it (`/workspace/...`, or anywhere in a template sandbox's root). */
  path: z.string(),
  kind: z.enum(['added', 'modified', 'deleted']),
  type: z.enum(['file', 'dir', 'symlink', 'other']),
  /** Of the new entry; of the old one for a deleted entry. */
  sizeBytes: z.number().int().nonnegative(),
  /** sha256 of the new content (files added or modified). */
  sha256: z.string().optional(),
  /** Permission bits of the new entry. */
  mode: z.number().int(),
  /** A symlink's target. */
  target: z.string().optional(),
});
export type Change = z.infer<typeof ChangeSchema>;

export const ChangesSchema = z.object({
  sandboxId: z.string(),
  /** What the changes are measured against: a snapshot, a template, or nothing (an empty workspace). */
  origin: z.object({ snapshotId: z.string().optional(), template: z.string().optional() }),
  changes: z.array(ChangeSchema),
  /** More paths changed than one answer lists (MAX_CHANGES): the list is incomplete. */
  truncated: z.boolean(),
});
export type Changes = z.infer<typeof ChangesSchema>;

export const MAX_CHANGES = 10_000;

export const ChangesQuery = z.strictObject({ since: z.string().regex(SNAPSHOT_ID_PATTERN, 'must be a snapshot id').optional() });

export const ApplyChangesBody = z.strictObject({
  from: z.string().regex(SANDBOX_ID_PATTERN, 'must be a sandbox id').meta({ description: 'A fork of this sandbox: its changes since the fork are applied here.' }),
});

export const ApplyResultSchema = z.object({ applied: z.array(ChangeSchema), from: z.string(), snapshotId: z.string() });
export type ApplyResult = z.infer<typeof ApplyResultSchema>;
