import { SandboxError } from '../errors/index.js';
import type { SandboxSpec } from '../sandbox-spec/index.js';
import type { HostMount } from '../host/mount-roots.host.js';

/** The resolved mounts of `spec`, or INTERNAL when the engine did not resolve every one (fail closed). */
export function hostMountsOf(spec: SandboxSpec, mounts: readonly HostMount[] | undefined): readonly HostMount[] {
  const resolved = mounts ?? [];
  if (resolved.length !== spec.mounts.length || resolved.some((m, i) => m.index !== i || m.sandboxPath !== spec.mounts[i]?.sandboxPath)) {
    throw new SandboxError('INTERNAL', 'the spec has host mounts that were not resolved against the operator\'s mount roots', {
      hint: 'Create sandboxes through the engine (SandboxManager or Runner), which checks mounts against the granted roots.',
    });
  }
  return resolved;
}

/**
 * capsule-launch's `--mount` arguments, each resolved at fd `firstFd + index` and attached
 * read-only at `target(index)` in the launcher's private mount namespace.
 */
export function launchMountArgs(mounts: readonly HostMount[], firstFd: number, target: (index: number) => string): string[] {
  return mounts.flatMap((m) => [
    '--mount', `${m.index}:${firstFd + m.index}:${m.kind === 'dir' ? 'd' : 'f'}`, m.rootDir, m.subpath,
    '--attach', `${firstFd + m.index}:ro`, target(m.index),
  ]);
}

const REFUSED = /capsule-launch: mount (\d+) refused \((INVALID_PATH|PERMISSION_DENIED)\): (.*)/;

/**
 * The error for a mount capsule-launch refused (its stderr says `mount I refused (CODE): why`),
 * or undefined when the start failed for another reason. Something on the host changed between
 * the engine's check and the launch, or the engine's check missed what the launcher caught.
 */
export function mountRefusal(stderr: string, spec: SandboxSpec): SandboxError | undefined {
  const match = REFUSED.exec(stderr);
  if (!match) return undefined;
  const index = Number(match[1]);
  const code = match[2] as 'INVALID_PATH' | 'PERMISSION_DENIED';
  const mount = spec.mounts[index];
  return new SandboxError(code, `mounts[${index}].subpath "${mount?.subpath ?? ''}" under root ${mount?.root ?? '?'}: ${match[3] ?? ''}`, {
    details: { field: `mounts[${index}].subpath`, root: mount?.root, subpath: mount?.subpath ?? '' },
    hint: 'Name a directory or regular file under the root through real directories (no symlinks, no ".."), away from kernel filesystems and Capsule\'s data directory.',
  });
}
