import { createHash, randomBytes } from 'node:crypto';
import { createReadStream, createWriteStream, existsSync, statSync, unlinkSync } from 'node:fs';
import { mkdir, open, readdir, rename, rm, stat, unlink } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { Transform, type Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import Database from 'better-sqlite3';
import { SandboxError } from '../../errors/index.js';
import { ArtifactIndex, toArtifact, type ArtifactRow } from './index-db.js';
import {
  ARTIFACT_ID_PATTERN, DEFAULT_RETENTION_MS, SHA256_PATTERN,
  type Artifact, type ArtifactListQuery, type ArtifactMeta, type ArtifactScope, type ArtifactStore, type SweepReport,
} from './types.js';

export interface LocalArtifactStoreOptions {
  /** Directory of the store, usually `<dataDir>/artifacts`. */
  root: string;
  /** How long artifacts are kept when `put` names no retention. @default 7 days */
  retentionMs?: number;
  /** The clock; tests pass a fake one to check retention. @default () => new Date() */
  now?: () => Date;
  /**
   * An unreferenced blob younger than this is left alone by the sweep: a `put` may be about to
   * record it. @default 1 hour
   */
  orphanGraceMs?: number;
}

const READ_CHUNK_BYTES = 1024 * 1024;
/** A temp file older than this belongs to a writer that died; it is removed at open. */
const STALE_TEMP_MS = 60 * 60 * 1000;

/**
 * Content-addressed artifacts on local disk: blobs at `sha256/ab/cdef…` (written to a temp file,
 * fsynced, re-read and verified, then renamed into place) and one SQLite row per artifact with
 * its name, tenant, sandbox and retention. Several processes may share one store: the rename of
 * a blob and the removal of an unreferenced one each run inside a SQLite write transaction.
 */
export class LocalArtifactStore implements ArtifactStore {
  readonly root: string;
  private readonly index: ArtifactIndex;
  private readonly retentionMs: number;
  private readonly now: () => Date;
  private readonly orphanGraceMs: number;

  private constructor(options: LocalArtifactStoreOptions, index: ArtifactIndex) {
    this.root = options.root;
    this.index = index;
    this.retentionMs = options.retentionMs ?? DEFAULT_RETENTION_MS;
    this.now = options.now ?? (() => new Date());
    this.orphanGraceMs = options.orphanGraceMs ?? 60 * 60 * 1000;
  }

  /** Creates the directories and the index if needed and removes temp files of dead writers. */
  static async open(options: LocalArtifactStoreOptions): Promise<LocalArtifactStore> {
    await mkdir(join(options.root, 'tmp'), { recursive: true, mode: 0o700 });
    await mkdir(join(options.root, 'sha256'), { recursive: true, mode: 0o700 });
    const store = new LocalArtifactStore(options, new ArtifactIndex(new Database(join(options.root, 'index.sqlite'))));
    await store.removeStaleTemps();
    return store;
  }

  async put(source: Readable, meta: ArtifactMeta, options: { signal?: AbortSignal } = {}): Promise<Artifact> {
    options.signal?.throwIfAborted();
    const temp = join(this.root, 'tmp', `${randomBytes(12).toString('hex')}.part`);
    try {
      const streamed = await writeHashing(source, temp, options.signal);
      // Recompute from the stored copy (what is delivered is what was stored, not what was sent)
      // while the copy is flushed to disk.
      const [stored] = await Promise.all([digestFile(temp, streamed.size), flush(temp)]);
      if (stored.sha256 !== streamed.sha256 || stored.size !== streamed.size) {
        throw verifyFailed(meta.name, `the stored copy (${stored.size} bytes, sha256 ${stored.sha256.slice(0, 12)}…) differs from the bytes written (${streamed.size} bytes, sha256 ${streamed.sha256.slice(0, 12)}…)`);
      }
      if (meta.expectedSize !== undefined && stored.size !== meta.expectedSize) {
        throw verifyFailed(meta.name, `${stored.size} bytes were stored but the file had ${meta.expectedSize} bytes when the copy started`);
      }
      const created = this.now();
      const row: ArtifactRow = {
        id: newArtifactId(),
        sha256: stored.sha256,
        name: meta.name,
        path: meta.path ?? meta.name,
        size: stored.size,
        tenantId: meta.tenantId,
        sandboxId: meta.sandboxId,
        createdAt: created.getTime(),
        expiresAt: created.getTime() + (meta.retentionMs ?? this.retentionMs),
      };
      const blob = this.blobPath(stored.sha256);
      // The blob is in place and durable before the row that points at it. Until the row exists
      // the blob is unreferenced; its fresh mtime keeps the sweep away (orphanGraceMs).
      await mkdir(dirname(blob), { recursive: true, mode: 0o700 });
      await rename(temp, blob);
      await fsyncDir(dirname(blob));
      this.index.write(() => {
        if (!existsSync(blob)) {
          throw new SandboxError('INTERNAL', `artifact ${meta.name} was removed by a concurrent delete of the same content before it was recorded`, {
            details: { name: meta.name, sha256: stored.sha256 },
            hint: 'Collect again.',
          });
        }
        this.index.insert(row);
      });
      return toArtifact(row);
    } finally {
      await rm(temp, { force: true });
    }
  }

  async get(ref: string, scope: ArtifactScope = {}): Promise<Readable> {
    const artifact = await this.stat(ref, scope);
    const handle = await open(this.blobPath(artifact.sha256), 'r').catch((error: unknown) => {
      throw new SandboxError('INTERNAL', `artifact ${artifact.id} is recorded but its blob is missing`, {
        details: { artifactId: artifact.id, sha256: artifact.sha256 },
        cause: error,
      });
    });
    return handle.createReadStream({ highWaterMark: READ_CHUNK_BYTES });
  }

  // eslint-disable-next-line @typescript-eslint/require-await -- async so that a bad ref rejects, never throws
  async stat(ref: string, scope: ArtifactScope = {}): Promise<Artifact> {
    checkRef(ref);
    const row = this.index.find(ref, scope.tenantId, this.now().getTime());
    if (!row) {
      throw new SandboxError('NOT_FOUND', `artifact ${ref} does not exist or its retention ended`, {
        details: { artifact: ref },
        hint: 'List the artifacts of the sandbox to see what is kept; artifacts are removed when their retention ends.',
      });
    }
    return toArtifact(row);
  }

  async delete(ref: string, scope: ArtifactScope = {}): Promise<void> {
    await this.stat(ref, scope); // NOT_FOUND for unknown refs and for other tenants' artifacts
    const digests = this.index.write(() => this.index.remove(ref, scope.tenantId));
    for (const sha256 of digests) this.removeBlobIfUnreferenced(sha256, 0);
  }

  list(query: ArtifactListQuery = {}): Promise<Artifact[]> {
    return Promise.resolve(this.index.list(query, this.now().getTime()).map(toArtifact));
  }

  /** Removes expired rows, then every blob no row points at (left by crashes, too) past the grace. */
  async sweepExpired(now: Date = this.now()): Promise<SweepReport> {
    const expired = this.index.write(() => this.index.removeExpired(now.getTime()));
    let blobsRemoved = 0;
    const root = join(this.root, 'sha256');
    for (const prefix of await readdir(root)) {
      for (const rest of await readdir(join(root, prefix)).catch(() => [] as string[])) {
        const sha256 = `${prefix}${rest}`;
        if (SHA256_PATTERN.test(sha256) && this.removeBlobIfUnreferenced(sha256, this.orphanGraceMs)) blobsRemoved++;
      }
    }
    return { expired, blobsRemoved };
  }

  bytesByTenant(tenantId?: string): Promise<Map<string, number>> {
    return Promise.resolve(this.index.bytesByTenant(this.now().getTime(), tenantId));
  }

  close(): Promise<void> {
    this.index.close();
    return Promise.resolve();
  }

  /** Host path of a blob: `sha256/ab/cdef…`. */
  blobPath(sha256: string): string {
    return join(this.root, 'sha256', sha256.slice(0, 2), sha256.slice(2));
  }

  /**
   * Check and unlink run under the index's write lock. A blob younger than `graceMs` (by its
   * mtime, on the filesystem's clock) may belong to a `put` that has not recorded its row yet.
   */
  private removeBlobIfUnreferenced(sha256: string, graceMs: number): boolean {
    const path = this.blobPath(sha256);
    return this.index.write(() => {
      if (this.index.references(sha256) > 0) return false;
      try {
        if (graceMs > 0 && statSync(path).mtimeMs > Date.now() - graceMs) return false;
        unlinkSync(path);
        return true;
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code === 'ENOENT') return false;
        throw error;
      }
    });
  }

  private async removeStaleTemps(): Promise<void> {
    const dir = join(this.root, 'tmp');
    const cutoff = Date.now() - STALE_TEMP_MS;
    for (const name of await readdir(dir)) {
      const info = await stat(join(dir, name)).catch(() => undefined);
      if (info && info.mtimeMs < cutoff) await unlink(join(dir, name)).catch(() => undefined);
    }
  }
}

export interface Digest {
  sha256: string;
  size: number;
}

/** Streams `source` into a new file at `target`, hashing on the way. */
async function writeHashing(source: Readable, target: string, signal: AbortSignal | undefined): Promise<Digest> {
  const hash = createHash('sha256');
  let size = 0;
  const hashing = new Transform({
    transform(chunk: Buffer | string, _encoding, callback) {
      const buffer = typeof chunk === 'string' ? Buffer.from(chunk) : chunk;
      hash.update(buffer);
      size += buffer.length;
      callback(null, buffer);
    },
  });
  // A pipeline overlaps reading the source with writing the copy.
  await pipeline(source, hashing, createWriteStream(target, { flags: 'wx', mode: 0o600, highWaterMark: READ_CHUNK_BYTES }), { signal });
  return { sha256: hash.digest('hex'), size };
}

async function flush(path: string): Promise<void> {
  const handle = await open(path, 'r');
  try {
    await handle.datasync();
  } finally {
    await handle.close();
  }
}

/** SHA-256 and size of a file as it is on disk. */
export async function digestFile(path: string, sizeHint?: number): Promise<Digest> {
  const hash = createHash('sha256');
  let size = 0;
  for await (const chunk of createReadStream(path, { highWaterMark: chunkBytesFor(sizeHint) })) {
    hash.update(chunk as Buffer);
    size += (chunk as Buffer).length;
  }
  return { sha256: hash.digest('hex'), size };
}

/** A read buffer as large as the file (+1 to see its end), within 16 KiB .. 1 MiB: small files are common. */
export function chunkBytesFor(sizeHint: number | undefined): number {
  return sizeHint === undefined ? READ_CHUNK_BYTES : Math.min(READ_CHUNK_BYTES, Math.max(16 * 1024, sizeHint + 1));
}

async function fsyncDir(path: string): Promise<void> {
  const handle = await open(path, 'r');
  try {
    await handle.sync();
  } finally {
    await handle.close();
  }
}

function verifyFailed(name: string, why: string): SandboxError {
  return new SandboxError('INTERNAL', `artifact ${name} failed verification: ${why}; it was not stored`, {
    details: { reason: 'verify_failed', name },
    hint: 'Collect again once nothing writes the file; if it repeats, check the disk of the artifact store.',
  });
}

/** True when `error` is a verification failure of `put` (the artifact was not stored). */
export function isVerifyFailure(error: unknown): boolean {
  return error instanceof SandboxError && error.details?.reason === 'verify_failed';
}

function checkRef(ref: string): void {
  if (SHA256_PATTERN.test(ref) || ARTIFACT_ID_PATTERN.test(ref)) return;
  throw new SandboxError('INVALID_ARGUMENT', `"${ref.slice(0, 80)}" is neither an artifact id nor a sha256`, {
    details: { field: 'artifact' },
    hint: 'Pass the id (art_…) or the 64-hex sha256 returned with the artifact.',
  });
}

function newArtifactId(): string {
  const alphabet = 'abcdefghijklmnopqrstuvwxyz0123456789';
  let id = 'art_';
  for (const byte of randomBytes(20)) id += alphabet[byte % 36];
  return id;
}
