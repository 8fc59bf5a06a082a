import { realpath } from 'node:fs/promises';
import type { BackendSandbox } from '../backends/backend.js';
import { openRegular, resolveWorkspacePath, walkOutput, normalizeWorkspacePath, type OutputEntry } from '../host/output-files.host.js';
import type { ArtifactOutcome } from '../wire/index.js';
import type { ArtifactCollection, ArtifactRef, SkipReason } from '../wire/index.js';
import { chunkBytesFor, isVerifyFailure, type Artifact, type ArtifactStore } from '../store/artifacts/index.js';

const MiB = 1024 * 1024;

export const DEFAULT_ARTIFACT_DIR = '/workspace/output';
export const DEFAULT_MAX_FILE_BYTES = 64 * MiB;
export const DEFAULT_MAX_TOTAL_BYTES = 128 * MiB;
export const DEFAULT_MAX_FILES = 10_000;
/** Tenant of artifacts collected outside the server (the one-shot runner, the CLI). */
export const LOCAL_TENANT = 'local';
/** Files copied at once: each holds a libuv threadpool thread (4 by default) while it fsyncs. */
const DELIVERY_CONCURRENCY = 4;

export interface CollectOptions {
  /** Sandbox directory to collect; must be under /workspace. @default '/workspace/output' */
  dir?: string;
  /** A larger file is not copied: `skipped: 'too_large'`. @default 64 MiB */
  maxFileBytes?: number;
  /** Files past this total are not copied: `skipped: 'total_cap'`, `truncated: true`. @default 128 MiB */
  maxTotalBytes?: number;
  /** Files past this count are not listed; `truncated: true`. @default 10000 */
  maxFiles?: number;
  /** @default 'local' */
  tenantId?: string;
  /** @default the store's retention (7 days) */
  retentionMs?: number;
  /**
   * Freeze the sandbox while collecting and thaw it afterwards. Pass false when the caller holds
   * it frozen already (the one-shot runner, a paused sandbox). @default true
   */
  freeze?: boolean;
  /** Receives one outcome per file (for `CapsuleMetrics.recordArtifact`). */
  onOutcome?: (outcome: ArtifactOutcome) => void;
  /**
   * Called with the bytes the collection plans to store, before anything is copied: throws to
   * refuse it (a tenant's disk quota, QUOTA_EXCEEDED); the function it returns is called once
   * with the bytes stored, when the copies are done (or failed).
   */
  reserve?: (plannedBytes: number) => (storedBytes: number) => void;
  signal?: AbortSignal;
}

/** A collection as the engine makes it: the wire's, plus the bytes delivered (for quotas). */
export interface Collection extends ArtifactCollection {
  deliveredBytes: number;
}

const METRIC_OUTCOME: Record<SkipReason, ArtifactOutcome> = {
  too_large: 'too_large',
  total_cap: 'too_large',
  verify_failed: 'verify_failed',
  symlink: 'skipped',
  special: 'skipped',
  changing: 'skipped',
};

/** Refuses options that can never work (a directory outside /workspace) before any sandbox starts. */
export function checkCollectOptions(options: CollectOptions): void {
  normalizeWorkspacePath(options.dir ?? DEFAULT_ARTIFACT_DIR);
}

/**
 * Copies the regular files of a sandbox directory into the artifact store and returns a reference
 * per file. Reads go through the host path of the workspace: symlinks are reported, never
 * followed; the sandbox is frozen so a file still being written is not taken as complete (and a
 * file whose size or mtime moved during the copy is reported `changing`, not delivered).
 */
export async function collectArtifacts(sandbox: BackendSandbox, store: ArtifactStore, options: CollectOptions = {}): Promise<Collection> {
  const dir = normalizeWorkspacePath(options.dir ?? DEFAULT_ARTIFACT_DIR);
  const freeze = options.freeze ?? true;
  if (freeze) await sandbox.freeze();
  try {
    return await collectFrozen(sandbox, store, dir, options);
  } finally {
    if (freeze) await sandbox.thaw();
  }
}

async function collectFrozen(sandbox: BackendSandbox, store: ArtifactStore, dir: string, options: CollectOptions): Promise<Collection> {
  const collection: Collection = { artifacts: [], truncated: false, deliveredBytes: 0 };
  const record = (ref: ArtifactRef): void => {
    collection.artifacts.push(ref);
    options.onOutcome?.('skipped' in ref ? METRIC_OUTCOME[ref.skipped] : 'ok');
  };
  const resolved = await resolveWorkspacePath(sandbox.workspaceDir, dir);
  if (resolved.kind === 'symlink') {
    record({ name: '.', path: dir, skipped: 'symlink' });
    return collection;
  }
  if (resolved.kind === 'missing' || !resolved.info.isDirectory()) return collection;

  const walked = await walkOutput(resolved.hostPath, { maxEntries: options.maxFiles ?? DEFAULT_MAX_FILES });
  collection.truncated = walked.truncated;
  const maxFileBytes = options.maxFileBytes ?? DEFAULT_MAX_FILE_BYTES;
  const maxTotalBytes = options.maxTotalBytes ?? DEFAULT_MAX_TOTAL_BYTES;
  // Decide in name order what fits the caps, then copy with a few files in flight: each stored
  // file costs an fsync, and the disk serves concurrent ones together.
  const refs: (ArtifactRef | undefined)[] = [];
  const toDeliver: { index: number; entry: OutputEntry }[] = [];
  let plannedBytes = 0;
  for (const entry of walked.entries) {
    const base = { name: entry.name, path: `${dir}/${entry.name}` };
    if (entry.kind !== 'file') refs.push({ ...base, skipped: entry.kind });
    else if (entry.size > maxFileBytes) refs.push({ ...base, size: entry.size, skipped: 'too_large' });
    else if (plannedBytes + entry.size > maxTotalBytes) {
      collection.truncated = true;
      refs.push({ ...base, size: entry.size, skipped: 'total_cap' });
    } else {
      plannedBytes += entry.size;
      toDeliver.push({ index: refs.length, entry });
      refs.push(undefined);
    }
  }
  const root = await realpath(sandbox.workspaceDir);
  const settle = plannedBytes > 0 ? options.reserve?.(plannedBytes) : undefined;
  let next = 0;
  const worker = async (): Promise<void> => {
    for (let job = toDeliver[next++]; job; job = toDeliver[next++]) {
      options.signal?.throwIfAborted();
      refs[job.index] = await deliver(job.entry, `${dir}/${job.entry.name}`, root, sandbox.id, store, options);
    }
  };
  try {
    await Promise.all(Array.from({ length: Math.min(DELIVERY_CONCURRENCY, toDeliver.length) }, worker));
  } finally {
    settle?.(refs.reduce((sum, ref) => sum + (ref && !('skipped' in ref) ? ref.size : 0), 0));
  }
  for (const ref of refs) {
    if (!ref) continue;
    if (!('skipped' in ref)) collection.deliveredBytes += ref.size;
    record(ref);
  }
  return collection;
}

async function deliver(entry: OutputEntry, path: string, root: string, sandboxId: string, store: ArtifactStore, options: CollectOptions): Promise<ArtifactRef> {
  const opened = await openRegular(entry.hostPath, root);
  if (!opened) return { name: entry.name, path, skipped: 'symlink' }; // replaced since the walk
  const { handle, info: before } = opened;
  let artifact: Artifact | undefined;
  try {
    const source = handle.createReadStream({ start: 0, highWaterMark: chunkBytesFor(before.size), autoClose: false });
    artifact = await store
      .put(source, { name: entry.name, path, tenantId: options.tenantId ?? LOCAL_TENANT, sandboxId, retentionMs: options.retentionMs, expectedSize: before.size }, { signal: options.signal })
      .catch((error: unknown) => {
        if (!isVerifyFailure(error)) throw error;
        return undefined;
      });
    const after = await handle.stat();
    const changed = after.size !== before.size || after.mtimeMs !== before.mtimeMs || after.ino !== before.ino;
    if (changed || before.size !== entry.size || before.mtimeMs !== entry.mtimeMs) {
      if (artifact) await store.delete(artifact.id);
      return { name: entry.name, path, size: after.size, skipped: 'changing' };
    }
  } finally {
    await handle.close();
  }
  if (!artifact) return { name: entry.name, path, size: before.size, skipped: 'verify_failed' };
  return { name: entry.name, path, size: artifact.size, sha256: artifact.sha256, uri: artifact.uri, id: artifact.id, expiresAt: artifact.expiresAt };
}
