import { lstat, realpath, statfs } from 'node:fs/promises';
import { isAbsolute, join, sep } from 'node:path';
import { SandboxError } from '../errors/index.js';
import { MOUNT_ROOT_NAME, type Mount } from '../sandbox-spec/index.js';

/**
 * One of a spec's host mounts, resolved by the engine against the operator's roots: capsule-launch
 * opens `subpath` beneath `rootDir` as root (no symlinks, directories and regular files only) and
 * refuses anything else, whatever changed on the host since the engine looked.
 */
export interface HostMount {
  /** Its position in `spec.mounts`, for error messages (`mounts[i]`). */
  index: number;
  /** The operator's root, canonical. */
  rootDir: string;
  /** Relative path under the root; "." for the root itself. */
  subpath: string;
  sandboxPath: string;
  /** What the engine found there; the launcher refuses a change of type. */
  kind: 'dir' | 'file';
}

/**
 * The operator's mount roots: the only host directories a tenant's spec can name, by name.
 * Checked once at start (`checkMountRoots`); each mount of a create is checked again here
 * (`resolveHostMount`) for a good early error, and a last time by capsule-launch as root.
 */
export type MountRoots = ReadonlyMap<string, string>;

/** Directories that are never a mount root nor inside one. */
const FORBIDDEN_TREES = ['/proc', '/sys', '/dev'];

/**
 * Filesystem magic numbers (statfs f_type) of kernel interfaces that are never a dataset:
 * proc, sysfs, cgroup v1/v2, devpts, debugfs, tracefs, securityfs, bpf, nsfs, configfs, efivarfs,
 * pstore, fusectl, binfmt_misc, selinuxfs, smackfs, mqueue, resctrl. native/launch-mounts.c
 * keeps the same list.
 */
const FORBIDDEN_MAGIC = new Set([
  0x9fa0, 0x62656572, 0x27e0eb, 0x63677270, 0x1cd1, 0x64626720, 0x74726163, 0x73636673, 0xcafe4a11,
  0x6e736673, 0x62656570, 0xde5e81e4, 0x6165676c, 0x65735543, 0x42494e4d, 0xf97cff8c, 0x43415d53,
  0x19800202, 0x7655821,
]);

function isAtOrBelow(path: string, dir: string): boolean {
  return path === dir || path.startsWith(dir === sep ? sep : `${dir}${sep}`);
}

/**
 * Validates the operator's roots (`serve --mount-root NAME=PATH`) and returns them canonical
 * (symlinks resolved): each must be an existing directory, not under /proc, /sys or /dev, not on
 * a kernel filesystem, and neither be, contain, nor lie inside any of `privateDirs` (Capsule's
 * data directory and database directory). Throws INVALID_ARGUMENT naming the root.
 */
export async function checkMountRoots(roots: Readonly<Record<string, string>>, privateDirs: readonly string[]): Promise<MountRoots> {
  const checked = new Map<string, string>();
  const privates = await Promise.all(privateDirs.map((dir) => realpath(dir).catch(() => dir)));
  for (const [name, path] of Object.entries(roots)) {
    const refuse = (why: string, hint: string): never => {
      throw new SandboxError('INVALID_ARGUMENT', `mount root ${name}=${path} ${why}`, { details: { field: `mountRoots.${name}`, value: path }, hint });
    };
    if (!MOUNT_ROOT_NAME.test(name)) refuse('has an invalid name', 'Name roots with 1-64 lowercase letters, digits, "_" or "-".');
    if (!isAbsolute(path)) refuse('is not an absolute path', 'Give the absolute path of a directory: --mount-root NAME=/srv/datasets.');
    const canonical = await realpath(path).catch(() => undefined);
    const info = canonical === undefined ? undefined : await lstat(canonical);
    if (canonical === undefined || !info?.isDirectory()) refuse('is not an existing directory', 'Create the directory first, or fix the path.');
    const root = canonical!;
    if (FORBIDDEN_TREES.some((tree) => isAtOrBelow(root, tree)) || FORBIDDEN_MAGIC.has((await statfs(root)).type)) {
      refuse('is a kernel filesystem (/proc, /sys, /dev, cgroup, ...), which is never mountable', 'Grant a directory that holds data, e.g. /srv/datasets.');
    }
    for (const dir of privates) {
      if (isAtOrBelow(root, dir) || isAtOrBelow(dir, root)) {
        refuse(`is, contains or lies inside Capsule's private directory ${dir}`, 'Grant a directory apart from --data-dir; Capsule\'s state is never mountable.');
      }
    }
    checked.set(name, root);
  }
  return checked;
}

function mountError(code: 'INVALID_PATH' | 'PERMISSION_DENIED', index: number, mount: Mount, why: string, hint: string): SandboxError {
  return new SandboxError(code, `mounts[${index}].subpath "${mount.subpath ?? ''}" under root ${mount.root}: ${why}`, {
    details: { field: `mounts[${index}].subpath`, root: mount.root, subpath: mount.subpath ?? '' },
    hint,
  });
}

/**
 * Resolves one granted mount to what capsule-launch will bind, checking what the launcher checks
 * (so that the usual mistakes get a precise error before anything is made): the subpath stays
 * under the root through real directories (no symlink, no ".."), names a directory or a regular
 * file (never a device, FIFO or socket), is not on a kernel filesystem and is not Capsule's data
 * directory, inside it, or around it. The launcher checks again as root: this is not the guard.
 */
export async function resolveHostMount(mount: Mount, index: number, rootDir: string, dataDir: string): Promise<HostMount> {
  const subpath = mount.subpath ?? '';
  if (subpath.startsWith('/')) throw mountError('INVALID_PATH', index, mount, 'must be relative to the root', 'Write the path under the root without a leading "/".');
  const parts = subpath.split('/').filter((part) => part !== '' && part !== '.');
  if (parts.includes('..')) throw mountError('INVALID_PATH', index, mount, 'leads out of the root ("..")', 'Name a path under the root; ".." is never followed.');
  let current = rootDir;
  const rootInfo = await lstat(rootDir).catch(() => undefined);
  if (!rootInfo?.isDirectory()) {
    throw new SandboxError('PERMISSION_DENIED', `mounts[${index}].root ${mount.root} is not available on this server`, {
      details: { field: `mounts[${index}].root`, root: mount.root },
      hint: 'Ask the operator: the root is configured but its directory is gone.',
    });
  }
  let info = rootInfo;
  for (const [at, part] of parts.entries()) {
    current = join(current, part);
    const next = await lstat(current).catch(() => undefined);
    if (!next) throw mountError('INVALID_PATH', index, mount, 'does not exist', 'Check the subpath; it is relative to the root.');
    if (next.isSymbolicLink()) throw mountError('INVALID_PATH', index, mount, `goes through a symlink (${parts.slice(0, at + 1).join('/')})`, 'Name the real path under the root; symlinks are never followed.');
    if (at < parts.length - 1 && !next.isDirectory()) throw mountError('INVALID_PATH', index, mount, `${parts.slice(0, at + 1).join('/')} is not a directory`, 'Check the subpath.');
    info = next;
  }
  if (!info.isDirectory() && !info.isFile()) {
    throw mountError('INVALID_PATH', index, mount, 'is a device, FIFO or socket', 'Only directories and regular files can be mounted.');
  }
  if (FORBIDDEN_MAGIC.has((await statfs(current)).type)) {
    throw mountError('PERMISSION_DENIED', index, mount, 'is on a kernel filesystem (proc, sysfs, cgroup, ...)', 'Mount data, not kernel interfaces; these are never mountable.');
  }
  const [real, data] = await Promise.all([realpath(current), realpath(dataDir).catch(() => dataDir)]);
  if (isAtOrBelow(real, data) || (info.isDirectory() && isAtOrBelow(data, real))) {
    throw mountError('PERMISSION_DENIED', index, mount, "is, contains or lies inside Capsule's data directory", "Capsule's own state is never mountable.");
  }
  return { index, rootDir, subpath: parts.length === 0 ? '.' : parts.join('/'), sandboxPath: mount.sandboxPath, kind: info.isDirectory() ? 'dir' : 'file' };
}
