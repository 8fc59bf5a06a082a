import { chmod, lstat, readdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { pathExists } from './fs-util.js';
import { WORKSPACE_PREFIX } from './volume.host.js';

/**
 * Capsule's data directory is root's alone: 0700, and everything in it without group or other
 * permissions. Sandboxes never reach it by path: capsule-launch opens what a sandbox's uid must
 * see (its workspace, the tools, the prepared /etc, a resolv.conf) as root and hands bubblewrap
 * fds; gVisor's gofer runs as root.
 *
 * Inside, only what a sandbox sees through those binds keeps read bits for others, because the
 * sandbox's host uid reads it there: the tools (`bin/`), the prepared /etc (`sandbox-etc/`) and a
 * network's `net/resolv.conf`. Workspaces are owned by their sandbox's uid, 0700.
 */
export const DATA_DIR_MODE = 0o700;

/** Entries of the data directory a sandbox reads through a bind: their modes are left alone. */
export const SANDBOX_VISIBLE = new Set(['bin', 'sandbox-etc', 'net/resolv.conf']);

/** The workspace volume's mount point: its root is made 0700, each workspace's top 0700 too. */
const VOLUME = 'volume';

/** Written once the walk below has run: a data directory made by this version needs none. */
const MARKER = '.private-v1';

/**
 * Takes group and other permissions off everything an older Capsule left under `dataDir`
 * (capsule.db was 0644, workspaces 0755, checkpoint images 0644), once: a marker records that it
 * ran. Symlinks are never followed; the files inside workspaces belong to their sandboxes and
 * are not touched (each workspace's top directory is 0700, which closes them).
 */
export async function privatizeDataDir(dataDir: string): Promise<void> {
  await chmod(dataDir, DATA_DIR_MODE);
  if (await pathExists(join(dataDir, MARKER))) return;
  for (const name of await readdir(dataDir)) {
    if (name === VOLUME) await privatizeVolume(join(dataDir, VOLUME));
    else await privatizeTree(dataDir, name);
  }
  await writeFile(join(dataDir, MARKER), 'group and other permissions removed\n', { mode: 0o600 });
}

/** Strips group and other bits from `relative` under `dataDir` and below, except SANDBOX_VISIBLE. */
async function privatizeTree(dataDir: string, relative: string): Promise<void> {
  if (SANDBOX_VISIBLE.has(relative)) return;
  const path = join(dataDir, relative);
  const info = await lstat(path).catch(() => undefined);
  if (!info || info.isSymbolicLink()) return;
  if ((info.mode & 0o077) !== 0) await chmod(path, info.mode & 0o7700);
  if (!info.isDirectory()) return;
  for (const name of await readdir(path).catch(() => [] as string[])) await privatizeTree(dataDir, join(relative, name));
}

async function privatizeVolume(volume: string): Promise<void> {
  const info = await lstat(volume).catch(() => undefined);
  if (!info?.isDirectory()) return;
  await chmod(volume, 0o700);
  for (const name of await readdir(volume)) {
    if (name.startsWith(WORKSPACE_PREFIX)) await chmod(join(volume, name), 0o700);
  }
}

/** Makes a tree runsc wrote (a checkpoint image: 0755 directories, 0644 files) root's alone. */
export async function privatizeWritten(path: string): Promise<void> {
  const info = await lstat(path).catch(() => undefined);
  if (!info || info.isSymbolicLink()) return;
  await chmod(path, info.mode & 0o7700);
  if (info.isDirectory()) for (const name of await readdir(path)) await privatizeWritten(join(path, name));
}
