import { SandboxError } from '../../errors/index.js';
import type { BackendSandbox } from '../../backends/backend.js';
import type { WorkspaceVolume } from '../../host/volume.host.js';
import type { Readable } from 'node:stream';
import { readBeneath, type TreeChange } from '../../host/tree-diff.host.js';
import { tarStream, type TarEntry } from './tar.js';
import { MAX_CHANGES, type ApplyResult, type Changes } from '../../wire/index.js';
import type { LiveSandbox } from '../sandbox-table.js';
import type { Snapshots } from '../snapshots.js';
import { hasTemplateRoot, type TemplateCatalog } from '../templates.js';
import type { SandboxFiles } from '../types.js';
import { conflictingPaths, diffTrees, sandboxPathOf, toWire } from './diff.js';

export interface ChangesContext {
  snapshots: Snapshots;
  volume: WorkspaceVolume;
  templates: TemplateCatalog;
}

type Running = LiveSandbox & { sandbox: BackendSandbox };

/** The read-only tree a sandbox's changes are measured against, and how to name it. */
async function originOf(context: ChangesContext, entry: Running, since: string | undefined, disk: 'root' | 'workspace'): Promise<{ dir: string | undefined; label: Changes['origin'] }> {
  const snapshotId = since ?? entry.info.origin?.snapshotId;
  if (snapshotId !== undefined) {
    const snapshot = context.snapshots.find(entry.info.tenantId, snapshotId);
    if (snapshot.disk !== disk) {
      throw new SandboxError('INVALID_ARGUMENT', `snapshot ${snapshotId} holds a ${snapshot.disk}, sandbox ${entry.info.sandboxId} a ${disk}: they cannot be compared`, {
        details: { field: 'since', snapshotId },
        hint: 'Compare against a snapshot of this sandbox or of one made from the same template.',
      });
    }
    return { dir: context.snapshots.diskOf(snapshot), label: { snapshotId } };
  }
  const template = entry.info.spec.template;
  if (hasTemplateRoot(template)) {
    const image = await context.templates.resolve(entry.info.tenantId, template!);
    return { dir: image.layerDir, label: { template: image.ref } };
  }
  return { dir: undefined, label: {} };
}

/** A read-only view of the sandbox's disk, taken with it frozen for the instant, for `use`. */
async function withView<T>(context: ChangesContext, entry: Running, use: (view: string, disk: 'root' | 'workspace') => Promise<T>): Promise<T> {
  const disk = await context.volume.diskPath(entry.info.sandboxId);
  const still = entry.info.state === 'running' ? entry.sandbox : undefined;
  return context.snapshots.disks.withReadOnlyView(disk.path, (view) => use(view, disk.kind), still);
}

/** Added, modified and deleted paths of the sandbox against its origin (or `since`). */
export async function listChanges(context: ChangesContext, entry: Running, since?: string): Promise<Changes> {
  return withView(context, entry, async (view, disk) => {
    const origin = await originOf(context, entry, since, disk);
    const { changes, truncated } = await diffTrees(origin.dir, view, MAX_CHANGES, disk);
    return { sandboxId: entry.info.sandboxId, origin: origin.label, changes: changes.map((c) => toWire(c, disk)), truncated };
  });
}

/**
 * Applies a fork's changes since its snapshot to the parent the snapshot was taken of, through the
 * parent's own file service and processes (as the sandbox's user: nothing is written from the host
 * into a live sandbox). Refused with CONFLICT and the paths when the parent changed any of them
 * since the fork, and with INVALID_ARGUMENT when `fork` was not made from a snapshot of `parent`.
 */
export async function applyChanges(
  context: ChangesContext,
  parent: Running,
  fork: Running,
  io: { files: SandboxFiles; run: (argv: string[]) => Promise<void> },
): Promise<ApplyResult> {
  const snapshotId = fork.info.origin?.snapshotId;
  const snapshot = snapshotId !== undefined ? context.snapshots.find(parent.info.tenantId, snapshotId) : undefined;
  if (!snapshot || snapshot.sandboxId !== parent.info.sandboxId) {
    throw new SandboxError('INVALID_ARGUMENT', `sandbox ${fork.info.sandboxId} is not a fork of ${parent.info.sandboxId}`, {
      details: { field: 'from', from: fork.info.sandboxId, sandboxId: parent.info.sandboxId },
      hint: 'Name a sandbox made by POST /v1/sandboxes/{id}/fork (or from a snapshot) of this sandbox.',
    });
  }
  const origin = context.snapshots.diskOf(snapshot);
  const ours = await withView(context, parent, (view, disk) => diffTrees(origin, view, MAX_CHANGES, disk));
  return withView(context, fork, async (view, disk) => {
    const theirs = await diffTrees(origin, view, MAX_CHANGES, disk);
    if (ours.truncated || theirs.truncated) {
      throw new SandboxError('LIMIT_EXCEEDED', `more than ${MAX_CHANGES} paths changed: too many to apply at once`, {
        details: { limit: MAX_CHANGES },
        hint: 'Export the fork\'s changes as a tar and apply them yourself, or apply smaller forks.',
      });
    }
    const conflicts = conflictingPaths(ours.changes, theirs.changes);
    if (conflicts.length > 0) {
      throw new SandboxError('CONFLICT', `sandbox ${parent.info.sandboxId} changed ${conflicts.length} path${conflicts.length === 1 ? '' : 's'} the fork changed too`, {
        details: { paths: conflicts.map((p) => sandboxPathOf(p, disk)), from: fork.info.sandboxId },
        hint: 'Resolve by hand: keep one side (kill the fork to discard it), or undo the parent\'s change to those paths and apply again.',
      });
    }
    for (const change of ordered(theirs.changes)) await applyOne(change, view, disk, io);
    return { from: fork.info.sandboxId, snapshotId: snapshot.snapshotId, applied: theirs.changes.map((c) => toWire(c, disk)) };
  });
}

/** Deletions deepest first, then directories shallowest first, then files and links. */
function ordered(changes: readonly TreeChange[]): TreeChange[] {
  const depth = (c: TreeChange) => c.path.split('/').length;
  const deleted = changes.filter((c) => c.kind === 'deleted').sort((a, b) => depth(b) - depth(a));
  const dirs = changes.filter((c) => c.kind !== 'deleted' && c.type === 'dir').sort((a, b) => depth(a) - depth(b));
  const rest = changes.filter((c) => c.kind !== 'deleted' && c.type !== 'dir');
  return [...deleted, ...dirs, ...rest];
}

async function applyOne(change: TreeChange, view: string, disk: 'root' | 'workspace', io: { files: SandboxFiles; run: (argv: string[]) => Promise<void> }): Promise<void> {
  const path = sandboxPathOf(change.path, disk);
  const mode = (change.mode & 0o7777).toString(8);
  if (change.kind === 'deleted') return io.files.remove(path);
  if (change.type === 'dir') {
    if (change.kind === 'added') await io.files.mkdir(path);
    return io.run(['chmod', mode, path]);
  }
  if (change.type === 'symlink') return io.run(['ln', '-sfn', '--', change.target ?? '', path]);
  if (change.type === 'file') {
    const body = await readBeneath(view, change.path);
    if (!body) return; // gone from the view since it was listed: nothing to copy
    await io.files.write(path, body);
    return io.run(['chmod', mode, path]);
  }
  // Devices, fifos and sockets are not copied.
}

/**
 * The sandbox's added and modified entries (files, directories, symlinks) as a tar, read from a
 * read-only view that lives until the stream ends; deletions are listed by `changes`, not here.
 */
export async function exportChanges(context: ChangesContext, entry: Running, since?: string): Promise<Readable> {
  const disk = await context.volume.diskPath(entry.info.sandboxId);
  const opened = await context.snapshots.disks.openView(disk.path, entry.info.state === 'running' ? entry.sandbox : undefined);
  try {
    const origin = await originOf(context, entry, since, disk.kind);
    const { changes } = await diffTrees(origin.dir, opened.view, MAX_CHANGES, disk.kind);
    const entries: TarEntry[] = changes
      .filter((c) => c.kind !== 'deleted' && c.type !== 'other')
      .map((c) => ({
        name: sandboxPathOf(c.path, disk.kind).slice(1),
        type: c.type as TarEntry['type'],
        mode: c.mode,
        size: c.type === 'file' ? c.sizeBytes : 0,
        ...(c.target !== undefined ? { linkname: c.target } : {}),
        ...(c.type === 'file' ? { body: () => readBeneath(opened.view, c.path) } : {}),
      }));
    const stream = tarStream(entries);
    stream.once('close', () => void opened.drop().catch(() => undefined));
    return stream;
  } catch (error) {
    await opened.drop();
    throw error;
  }
}
