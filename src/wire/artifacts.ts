import { z } from 'zod';
import { SANDBOX_ID_PATTERN, SandboxPath, queryNumber } from './common.js';
import { ExecResultSchema, InlineErrorSchema } from './process.js';

const GiB = 1024 ** 3;

/** How one artifact delivery ended: delivered, over a cap, failed verification, or not a regular file. */
export const ARTIFACT_OUTCOMES = ['ok', 'too_large', 'verify_failed', 'skipped'] as const;
export type ArtifactOutcome = (typeof ARTIFACT_OUTCOMES)[number];

/** Why a file that was seen was not delivered. */
export const SKIP_REASONS = ['too_large', 'total_cap', 'symlink', 'special', 'changing', 'verify_failed'] as const;

/** A file delivered to the artifact store. */
export const DeliveredArtifactSchema = z.object({
  /** Path relative to the collected directory, e.g. `plots/a.png`. */
  name: z.string(),
  /** Path as the sandbox saw it. */
  path: z.string(),
  size: z.number(),
  sha256: z.string(),
  /** `capsule://artifacts/<sha256>` (over HTTP: `/v1/artifacts/<sha256>`). */
  uri: z.string(),
  id: z.string(),
  expiresAt: z.string(),
});

/** A file that was seen but not delivered, and why. */
export const SkippedArtifactSchema = z.object({
  name: z.string(),
  path: z.string(),
  size: z.number().optional(),
  skipped: z.enum(SKIP_REASONS),
});

export const ArtifactRefSchema = z.union([DeliveredArtifactSchema, SkippedArtifactSchema]);

/** What a collection returns: one reference per file; skipped files say why. */
export const ArtifactCollectionSchema = z.object({
  artifacts: z.array(ArtifactRefSchema),
  /** Some files were left out by the total cap or the file-count cap. */
  truncated: z.boolean(),
});

/** One stored artifact, as the list and stat calls return it. */
export const StoredArtifactSchema = z.object({
  id: z.string(),
  name: z.string(),
  path: z.string(),
  size: z.number(),
  sha256: z.string(),
  uri: z.string(),
  sandboxId: z.string(),
  createdAt: z.string(),
  expiresAt: z.string(),
});

export const CollectArtifactsBody = z.strictObject({
  dir: SandboxPath.optional().meta({ description: 'Sandbox directory under /workspace. Default /workspace/output' }),
  maxFileBytes: z.number().int().positive().max(GiB).optional().meta({ description: 'A larger file is skipped (too_large). Default 64 MiB' }),
  maxTotalBytes: z.number().int().positive().max(4 * GiB).optional().meta({ description: 'Files past this total are skipped (total_cap). Default 128 MiB' }),
});

export const ArtifactParams = z.strictObject({
  ref: z.string().regex(/^(?:[0-9a-f]{64}|art_[0-9a-z]{20})$/, 'must be a sha256 or an artifact id'),
});

export const ListArtifactsQuery = z.strictObject({
  sandboxId: z.string().regex(SANDBOX_ID_PATTERN, 'must be a sandbox id').optional(),
  limit: queryNumber(4, 1, 1000).optional(),
});

/** A foreground exec's result; with `collectArtifacts`, the references collected after the exit. */
export const ExecReplySchema = ExecResultSchema.extend({
  artifacts: z.array(ArtifactRefSchema).optional(),
  artifactsTruncated: z.boolean().optional(),
  /** Why the collection failed (the exec's own outcome stands). */
  artifactsError: InlineErrorSchema.optional(),
});

export type SkipReason = (typeof SKIP_REASONS)[number];
export type DeliveredArtifact = z.output<typeof DeliveredArtifactSchema>;
export type SkippedArtifact = z.output<typeof SkippedArtifactSchema>;
export type ArtifactRef = z.output<typeof ArtifactRefSchema>;
export type ArtifactCollection = z.output<typeof ArtifactCollectionSchema>;
export type StoredArtifact = z.output<typeof StoredArtifactSchema>;
export type CollectArtifactsRequest = z.input<typeof CollectArtifactsBody>;
export type ExecReply = z.output<typeof ExecReplySchema>;
