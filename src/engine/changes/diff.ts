import { streamSendDump } from '../../host/btrfs-send.host.js';
import { compareTrees, type TreeChange } from '../../host/tree-diff.host.js';
import type { Change } from '../../wire/index.js';
import { TouchedPaths } from './send-dump.js';

/**
 * What changed from `origin` (a read-only subvolume, or undefined: an empty tree) to `current` (a
 * read-only subvolume): btrfs send lists the touched paths (work proportional to the change),
 * then each is compared on both sides for type, mode, link target and content (sha256).
 */
export async function diffTrees(origin: string | undefined, current: string, limit: number, disk: 'root' | 'workspace'): Promise<{ changes: TreeChange[]; truncated: boolean }> {
  const touched = new TouchedPaths(limit);
  await streamSendDump(origin, current, (line) => touched.push(line));
  // A root's mount points of Capsule's own (its tools) are not the sandbox's changes.
  const paths = disk === 'root' ? [...touched.paths].filter((p) => !CAPSULE_OWN.some((own) => p === own || p.startsWith(`${own}/`))) : touched.paths;
  return { changes: await compareTrees(origin, current, paths), truncated: touched.truncated };
}

/** Paths of a template root that the backends make for their own mounts. */
const CAPSULE_OWN = ['.capsule'];

/** Where the sandbox sees a path of its disk: a root's paths from `/`, a bare workspace's under /workspace. */
export function sandboxPathOf(rel: string, disk: 'root' | 'workspace'): string {
  return disk === 'root' ? `/${rel}` : `/workspace/${rel}`;
}

export function toWire(change: TreeChange, disk: 'root' | 'workspace'): Change {
  return { ...change, path: sandboxPathOf(change.path, disk) };
}

/**
 * Paths both sides changed since their common origin: the same path, or one inside the other
 * (a directory one side deleted, a file the other wrote in it). Directories both sides have alike,
 * and changes inside a directory that is still one, are not conflicts.
 */
export function conflictingPaths(ours: readonly TreeChange[], theirs: readonly TreeChange[]): string[] {
  const isDir = (c: TreeChange) => c.type === 'dir' && c.kind !== 'deleted';
  const conflicts = new Set<string>();
  for (const a of theirs) {
    for (const b of ours) {
      if (a.path === b.path) {
        if (!(isDir(a) && isDir(b) && a.mode === b.mode)) conflicts.add(a.path);
        continue;
      }
      const outer = b.path.startsWith(`${a.path}/`) ? a : a.path.startsWith(`${b.path}/`) ? b : undefined;
      if (outer && !isDir(outer)) conflicts.add(outer.path);
    }
  }
  return [...conflicts].sort();
}
