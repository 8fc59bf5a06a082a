import type { Readable } from 'node:stream';

/** Who an artifact belongs to and how long it is kept. */
export interface ArtifactMeta {
  /** The file's name relative to the collected directory, e.g. `plots/a.png`. */
  name: string;
  tenantId: string;
  /** The sandbox the file came from; artifacts outlive it. */
  sandboxId: string;
  /** Path as the sandbox saw it, e.g. `/workspace/output/plots/a.png`. @default name */
  path?: string;
  /** How long the artifact is kept. @default 7 days (the store's `retentionMs`) */
  retentionMs?: number;
  /**
   * What the writer expects to store. A stored copy whose size differs is refused with
   * `verify_failed` (a file that changed while it was read, or a short write).
   */
  expectedSize?: number;
}

/** One stored artifact: a metadata row pointing at a content-addressed blob. */
export interface Artifact {
  /** Unique per stored row; two rows may share one blob (same content). */
  id: string;
  name: string;
  path: string;
  size: number;
  /** Hex SHA-256 of the stored copy, recomputed after the copy. */
  sha256: string;
  /** `capsule://artifacts/<sha256>`; over HTTP the same blob is `/v1/artifacts/<sha256>`. */
  uri: string;
  tenantId: string;
  sandboxId: string;
  createdAt: string;
  expiresAt: string;
}

export interface ArtifactListQuery {
  tenantId?: string;
  sandboxId?: string;
  /** @default 1000 */
  limit?: number;
}

/** Restricts a lookup to one tenant: another tenant's artifact is reported as missing. */
export interface ArtifactScope {
  tenantId?: string;
}

export interface SweepReport {
  /** Metadata rows removed because their retention ended. */
  expired: number;
  /** Blobs removed because no row pointed at them any more. */
  blobsRemoved: number;
}

/**
 * Where artifacts live. The embedded implementation is `LocalArtifactStore` (local disk + SQLite
 * index); an S3-compatible store implements the same methods. `ref` is an artifact id or a sha256.
 */
export interface ArtifactStore {
  /** Streams `source` into the store, verifies the stored copy, and records it. */
  put(source: Readable, meta: ArtifactMeta, options?: { signal?: AbortSignal }): Promise<Artifact>;
  /** The stored bytes. `NOT_FOUND` when unknown, expired or of another tenant. */
  get(ref: string, scope?: ArtifactScope): Promise<Readable>;
  stat(ref: string, scope?: ArtifactScope): Promise<Artifact>;
  /** Removes the row (by id) or every row of the digest (by sha256) of the scope, then unreferenced blobs. */
  delete(ref: string, scope?: ArtifactScope): Promise<void>;
  list(query?: ArtifactListQuery): Promise<Artifact[]>;
  /** Removes rows whose retention ended and blobs nothing points at. */
  sweepExpired(now?: Date): Promise<SweepReport>;
  /** Bytes of live artifacts per tenant (each row counts its size, shared content or not), for disk quotas. */
  bytesByTenant(tenantId?: string): Promise<Map<string, number>>;
  close(): Promise<void>;
}

export const SHA256_PATTERN = /^[0-9a-f]{64}$/;
export const ARTIFACT_ID_PATTERN = /^art_[0-9a-z]{20}$/;
export const DEFAULT_RETENTION_MS = 7 * 24 * 60 * 60 * 1000;

export function artifactUri(sha256: string): string {
  return `capsule://artifacts/${sha256}`;
}

/** The HTTP path of a blob on a Capsule server. */
export function artifactHttpPath(sha256: string): string {
  return `/v1/artifacts/${sha256}`;
}
