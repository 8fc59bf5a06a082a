import { SandboxError } from '../errors/index.js';
import type { SandboxSpec } from '../sandbox-spec/index.js';
import type { HostMount } from '../host/mount-roots.host.js';
import { resolveHostMount, type MountRoots } from '../host/mount-roots.host.js';

/** The mount roots a caller may use: the names its API key was granted, or every root (the operator). */
export type MountGrant = readonly string[] | 'all';

/**
 * Resolves a spec's host mounts for a caller. A root that does not exist and a root the caller
 * was not granted get the same answer (PERMISSION_DENIED on `mounts[i].root`): a tenant learns
 * nothing about roots it may not use. Each granted mount is then checked on the host (no
 * symlinks, no "..", directories and regular files only, no kernel filesystem, not Capsule's
 * data directory): INVALID_PATH or PERMISSION_DENIED on `mounts[i].subpath`.
 */
export async function resolveMounts(spec: SandboxSpec, grant: MountGrant, roots: MountRoots, dataDir: string): Promise<HostMount[]> {
  spec.mounts.forEach((mount, index) => {
    const granted = grant === 'all' || grant.includes(mount.root);
    if (!granted || !roots.has(mount.root)) {
      throw new SandboxError('PERMISSION_DENIED', `mounts[${index}].root: this API key may not mount root "${mount.root}"`, {
        details: { field: `mounts[${index}].root`, root: mount.root },
        hint: 'Use a mount root the operator granted to this key (POST /v1/keys with mountRoots); host paths cannot be mounted directly.',
      });
    }
  });
  const resolved: HostMount[] = [];
  for (const [index, mount] of spec.mounts.entries()) resolved.push(await resolveHostMount(mount, index, roots.get(mount.root)!, dataDir));
  return resolved;
}
