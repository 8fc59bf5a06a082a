import { lstat, readdir, readFile, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { listSandboxCgroups, SandboxCgroup } from '../host/cgroups.host.js';
import { withLock } from '../host/lock.host.js';
import { imageLayerKey } from './keys.js';
import { collectLayout } from './oci/image-tools.host.js';
import { isOwnerAlive } from './owner.js';
import { BUILD_CGROUP } from './tool-job.host.js';

/**
 * Removes what builds of dead processes left outside the layer store: their jobs' cgroups
 * (killing anything still in them, e.g. mmdebstrap workers of a crashed server) and their temp
 * directories (TMPDIR, gpg homes, rewritten apt sources).
 */
export async function reconcileBuildJobs(cgroupPrefix: string, tempRoot: string): Promise<string[]> {
  const removed: string[] = [];
  const prefix = `${cgroupPrefix}${BUILD_CGROUP}`;
  for (const name of await listSandboxCgroups(prefix)) {
    if (isOwnerAlive(name.slice(prefix.length))) continue;
    await SandboxCgroup.attach(name).remove();
    removed.push(`cgroup ${name}`);
  }
  for (const name of await readdir(tempRoot).catch(() => [] as string[])) {
    if (isOwnerAlive(name)) continue;
    await rm(join(tempRoot, name), { recursive: true, force: true });
    removed.push(`build temp ${name}`);
  }
  return removed;
}

/**
 * Drops the image cache's tags whose layer is gone (tags are the image digests), then the blobs
 * nothing refers to (`umoci gc`). Returns the bytes freed.
 */
export async function pruneImageCache(layout: string, keptLayers: ReadonlySet<string>): Promise<number> {
  return withLock(`${layout}.lock`, async () => {
    const index = await readFile(join(layout, 'index.json'), 'utf8').catch(() => undefined);
    if (index === undefined) return 0;
    const before = await dirBytes(join(layout, 'blobs'));
    const tags = ((JSON.parse(index) as { manifests?: { annotations?: Record<string, string> }[] }).manifests ?? [])
      .map((m) => m.annotations?.['org.opencontainers.image.ref.name'])
      .filter((tag): tag is string => tag !== undefined);
    const stale = tags.filter((tag) => !/^sha256-[0-9a-f]{64}$/.test(tag) || !keptLayers.has(imageLayerKey(tag.replace('-', ':'))));
    await collectLayout(layout, stale);
    return Math.max(0, before - (await dirBytes(join(layout, 'blobs'))));
  }, 600_000);
}

/** Bytes of the regular files under `dir` (symlinks not followed); 0 when it does not exist. */
export async function dirBytes(dir: string): Promise<number> {
  let total = 0;
  for (const entry of await readdir(dir, { withFileTypes: true }).catch(() => [])) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) total += await dirBytes(path);
    else if (entry.isFile()) total += (await lstat(path)).size;
  }
  return total;
}
