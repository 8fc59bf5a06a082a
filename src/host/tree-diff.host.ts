import { constants, createReadStream, type Stats } from 'node:fs';
import { lstat, open, readlink, type FileHandle } from 'node:fs/promises';
import { createHash } from 'node:crypto';
import { join } from 'node:path';
import type { Readable } from 'node:stream';

/**
 * Looking at the files of read-only snapshots from the host. A snapshot holds what a sandbox
 * wrote, links included, so nothing here follows a symlink: every directory on the way is checked
 * with lstat and files are opened with O_NOFOLLOW and matched to what lstat saw. The trees are
 * read-only (a snapshot, a template layer, a read-only view of a live disk) and no sandbox can
 * reach them, so what was checked stays true.
 */

export type EntryType = 'file' | 'dir' | 'symlink' | 'other';

export interface TreeEntry {
  type: EntryType;
  sizeBytes: number;
  /** Permission bits (07777). */
  mode: number;
  /** A symlink's target, as text. */
  target?: string;
}

export interface TreeChange {
  /** Relative to the tree's root, `/`-separated. */
  path: string;
  kind: 'added' | 'modified' | 'deleted';
  type: EntryType;
  /** Of the new entry; for a deleted one, of the old. */
  sizeBytes: number;
  /** sha256 of the new content (regular files that were added or modified). */
  sha256?: string;
  mode: number;
  target?: string;
}

function typeOf(info: Stats): EntryType {
  if (info.isFile()) return 'file';
  if (info.isDirectory()) return 'dir';
  if (info.isSymbolicLink()) return 'symlink';
  return 'other';
}

/** The entry at `rel` under `root` without following any symlink on the way, or undefined. */
export async function entryAt(root: string, rel: string): Promise<TreeEntry | undefined> {
  const info = await statBeneath(root, rel);
  if (!info) return undefined;
  const type = typeOf(info);
  const entry: TreeEntry = { type, sizeBytes: type === 'file' ? info.size : 0, mode: info.mode & 0o7777 };
  if (type === 'symlink') entry.target = await readlink(join(root, rel));
  return entry;
}

async function statBeneath(root: string, rel: string): Promise<Stats | undefined> {
  const parts = rel.split('/').filter((part) => part !== '' && part !== '.');
  if (parts.includes('..')) return undefined;
  let path = root;
  for (const [index, part] of parts.entries()) {
    path = join(path, part);
    const info = await lstat(path).catch(() => undefined);
    if (!info) return undefined;
    if (index === parts.length - 1) return info;
    if (!info.isDirectory()) return undefined;
  }
  return lstat(root).catch(() => undefined);
}

/**
 * Opens the regular file at `rel` for reading: O_NOFOLLOW, and the opened file must be the one
 * lstat found (same device and inode). Undefined when it is not a regular file there.
 */
export async function openBeneath(root: string, rel: string): Promise<FileHandle | undefined> {
  const seen = await statBeneath(root, rel);
  if (!seen?.isFile()) return undefined;
  const handle = await open(join(root, rel), constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
  const opened = await handle.stat();
  if (opened.dev !== seen.dev || opened.ino !== seen.ino || !opened.isFile()) {
    await handle.close();
    return undefined;
  }
  return handle;
}

/** A stream of the regular file at `rel`, or undefined (see openBeneath). */
export async function readBeneath(root: string, rel: string): Promise<Readable | undefined> {
  const handle = await openBeneath(root, rel);
  return handle ? createReadStream('', { fd: handle, autoClose: true }) : undefined;
}

export async function sha256Beneath(root: string, rel: string): Promise<string | undefined> {
  const stream = await readBeneath(root, rel);
  if (!stream) return undefined;
  const hash = createHash('sha256');
  for await (const chunk of stream) hash.update(chunk as Buffer);
  return hash.digest('hex');
}

/**
 * How each candidate path differs between `origin` (undefined: an empty tree) and `current`:
 * added, deleted, or modified (another type, content, mode or link target; owners are not
 * compared, since a copy given to another sandbox changes them all). Directories that exist in
 * both with the same mode are not changes. Paths that exist in neither are dropped.
 */
export async function compareTrees(origin: string | undefined, current: string, candidates: Iterable<string>): Promise<TreeChange[]> {
  const changes: TreeChange[] = [];
  for (const path of [...candidates].sort()) {
    const before = origin === undefined ? undefined : await entryAt(origin, path);
    const after = await entryAt(current, path);
    if (!before && !after) continue;
    if (!after) {
      changes.push({ path, kind: 'deleted', type: before!.type, sizeBytes: before!.sizeBytes, mode: before!.mode, ...(before!.target !== undefined ? { target: before!.target } : {}) });
      continue;
    }
    const kind = !before ? 'added' : (await differs(origin!, current, path, before, after)) ? 'modified' : undefined;
    if (!kind) continue;
    const change: TreeChange = { path, kind, type: after.type, sizeBytes: after.sizeBytes, mode: after.mode };
    if (after.target !== undefined) change.target = after.target;
    if (after.type === 'file') {
      const sha256 = await sha256Beneath(current, path);
      if (sha256 !== undefined) change.sha256 = sha256;
    }
    changes.push(change);
  }
  return changes;
}

async function differs(origin: string, current: string, path: string, before: TreeEntry, after: TreeEntry): Promise<boolean> {
  if (before.type !== after.type || before.mode !== after.mode) return true;
  if (after.type === 'symlink') return before.target !== after.target;
  if (after.type !== 'file') return false;
  if (before.sizeBytes !== after.sizeBytes) return true;
  const [a, b] = await Promise.all([sha256Beneath(origin, path), sha256Beneath(current, path)]);
  return a !== b;
}
