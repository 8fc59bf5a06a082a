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

/**
 * Turns on the cgroup2 mount option `favordynmods` (Linux ≥ 6.0) unless it is on already.
 *
 * Every sandbox start moves its launcher into the sandbox's v1 memory, pids and cpu groups
 * (cgroup2 has CLONE_INTO_CGROUP, v1 has no such call). By default the kernel makes each
 * migration wait for an RCU grace period so that forks and exits stay lock-free; on this host
 * that is ~8 ms of a 2 ms sandbox start. The kernel's documented remedy for a host that moves
 * tasks between cgroups all the time is this option: migrations take ~0.4 ms, forks and exits
 * take a shared lock instead of a per-CPU one. It is global (every hierarchy shares the lock),
 * changes no limit and no permission, and on newer kernels stays on until the next boot.
 *
 * `mount -o remount` keeps the mount's other options (util-linux passes the ones in mountinfo
 * along); the result is read back from mountinfo, so a kernel that ignores the option (or a
 * cgroup namespace that may not change it) is reported, never assumed.
 */
export async function favorCgroupMigrations(mountPoint: string = CGROUP2_MOUNT): Promise<CgroupMigrations> {
  const before = await superOptions(mountPoint);
  if (before === undefined) return { mode: 'default', reason: `no cgroup2 mount at ${mountPoint}` };
  if (before.includes('favordynmods')) return { mode: 'favordynmods', changed: false };
  const result = await runCommand(['mount', '-o', 'remount,favordynmods', mountPoint], { check: false, timeoutMs: 10_000 }).catch((error: Error) => ({
    exitCode: null,
    stderr: error.message,
  }));
  if ((await superOptions(mountPoint))?.includes('favordynmods')) return { mode: 'favordynmods', changed: true };
  const said = result.stderr.trim().split('\n')[0];
  return { mode: 'default', reason: `mount -o remount,favordynmods ${mountPoint} did not take effect${said ? `: ${said}` : ` (exit ${result.exitCode})`}` };
}

/** The super-block options of the cgroup2 mount at `mountPoint` (mountinfo's last field), if there is one. */
async function superOptions(mountPoint: string): Promise<string[] | undefined> {
  const mountinfo = await readFile('/proc/self/mountinfo', 'utf8');
  for (const line of mountinfo.split('\n')) {
    // id parent major:minor root mount-point options [optional fields...] - fstype source super-options
    const [mountFields, fsFields] = line.split(' - ');
    if (fsFields === undefined || mountFields?.split(' ')[4] !== mountPoint) continue;
    const [fstype, , options] = fsFields.split(' ');
    if (fstype === 'cgroup2') return (options ?? '').split(',');
  }
  return undefined;
}
