import { readFile } from 'node:fs/promises';
import { runCommand } from './run-command.host.js';

/** Where the host's cgroup2 file system is mounted (cgroups.host.ts keeps the v2 groups there). */
export const CGROUP2_MOUNT = '/sys/fs/cgroup/unified';

/**
 * How a process joins a cgroup on this host. `favordynmods`: in microseconds. `default`: each
 * migration into a cgroup v1 hierarchy waits for an RCU grace period (~8 ms measured here), and
 * `reason` says why the faster mode is not on.
 */
export type CgroupMigrations = { mode: 'favordynmods'; changed: boolean } | { mode: 'default'; reason: string };

/** A mount as mountinfo shows it: its per-mount options and its super-block (file system) options. */
export interface MountOptions {
  mount: string[];
  super: string[];
}

/**
 * Turns on the cgroup2 mount option `favordynmods` (Linux ≥ 6.0) unless it is on already
 * (decision 023).
 *
 * Every sandbox start moves its launcher into the sandbox's v1 memory, pids and cpu groups
 * (cgroup2 has CLONE_INTO_CGROUP, v1 has no such call). By default the kernel makes each
 * migration wait for an RCU grace period so that forks and exits stay cheap; on this host that is
 * ~8 ms of a 2 ms sandbox start. The kernel's documented remedy for a host that moves tasks
 * between cgroups all the time is this option: migrations take ~0.4 ms, forks and exits take the
 * lock's slower path. It is global (every hierarchy shares the lock), changes no limit and no
 * permission, and on newer kernels stays on until the next boot.
 *
 * A cgroup2 remount sets exactly the options it is given, so the command names every option the
 * mount has now (`remountOptions`), with nothing taken from fstab or mtab; the result is read back
 * and compared: a kernel that ignores the option (or a cgroup namespace that may not change it) is
 * reported, never assumed, and a remount that lost an option is undone and reported.
 */
export async function favorCgroupMigrations(mountPoint: string = CGROUP2_MOUNT): Promise<CgroupMigrations> {
  const before = await cgroup2Options(mountPoint);
  if (before === undefined) return { mode: 'default', reason: `no cgroup2 mount at ${mountPoint}` };
  if (before.super.includes('favordynmods')) return { mode: 'favordynmods', changed: false };
  const said = await remount(mountPoint, [...remountOptions(before), 'favordynmods']);
  const after = await cgroup2Options(mountPoint);
  const lost = after === undefined ? ['the mount'] : missingOptions(before, after);
  if (lost.length > 0) {
    await remount(mountPoint, remountOptions(before));
    return { mode: 'default', reason: `remounting ${mountPoint} with favordynmods lost ${lost.join(', ')}; its options were put back` };
  }
  if (after?.super.includes('favordynmods')) return { mode: 'favordynmods', changed: true };
  return { mode: 'default', reason: `mount -o remount,favordynmods ${mountPoint} did not take effect${said ? `: ${said}` : ''}` };
}

/** The options a remount must name to keep the mount as it is: its per-mount ones, then its file system's. */
export function remountOptions(options: MountOptions): string[] {
  const mount = options.mount.filter((option) => option !== 'rw' && option !== 'ro');
  const access = options.mount.includes('ro') ? 'ro' : 'rw';
  return [access, ...mount, ...options.super.filter((option) => option !== 'rw' && option !== 'ro')];
}

/** Options `before` had that `after` lacks. */
export function missingOptions(before: MountOptions, after: MountOptions): string[] {
  return [...before.mount.filter((option) => !after.mount.includes(option)), ...before.super.filter((option) => !after.super.includes(option))];
}

/** The options of the cgroup2 mount at `mountPoint` in a mountinfo text, if it has one. */
export function parseMountinfo(mountinfo: string, mountPoint: string): MountOptions | undefined {
  for (const line of mountinfo.split('\n')) {
    // id parent major:minor root mount-point options [optional fields...] - fstype source super-options
    const [mountFields, fsFields] = line.split(' - ');
    const fields = mountFields?.split(' ') ?? [];
    if (fsFields === undefined || fields[4] !== mountPoint) continue;
    const [fstype, , superOptions] = fsFields.split(' ');
    if (fstype === 'cgroup2') return { mount: (fields[5] ?? '').split(','), super: (superOptions ?? '').split(',') };
  }
  return undefined;
}

async function cgroup2Options(mountPoint: string): Promise<MountOptions | undefined> {
  return parseMountinfo(await readFile('/proc/self/mountinfo', 'utf8'), mountPoint);
}

/** Remounts with exactly `options` (util-linux reads no fstab or mtab for them); what it said on failure. */
async function remount(mountPoint: string, options: string[]): Promise<string> {
  try {
    const result = await runCommand(['mount', '--options-source=disable', '-o', ['remount', ...options].join(','), mountPoint], { check: false, timeoutMs: 10_000 });
    return result.exitCode === 0 ? '' : result.stderr.trim().split('\n')[0] || `exit ${result.exitCode ?? result.signal}`;
  } catch (error) {
    return (error as Error).message;
  }
}
