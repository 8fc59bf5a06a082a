import { describe, expect, it } from 'vitest';
import { buildBwrapArgs } from '../../src/backends/namespace/bwrap-args.js';
import { parseSpec } from '../../src/spec/index.js';

const base = { workspaceFd: 4, etcFd: 5, toolsFd: 6, seccompFd: 3, mountFds: [], shareNetwork: false };

describe('bwrap argv', () => {
  it('pins the isolation flags', () => {
    const args = buildBwrapArgs(parseSpec({}), base);
    for (const flag of ['--unshare-user', '--unshare-pid', '--unshare-ipc', '--unshare-uts', '--unshare-cgroup', '--unshare-net', '--disable-userns', '--die-with-parent', '--new-session', '--clearenv']) {
      expect(args).toContain(flag);
    }
    const line = args.join(' ');
    expect(line).toContain('--cap-drop ALL');
    expect(line).toContain('--seccomp 3');
    expect(line).toContain('--remount-ro / --remount-ro /dev');
    expect(line).toContain(`--size ${64 * 2 ** 20} --tmpfs /tmp`);
    expect(line).toContain(`--size ${64 * 2 ** 20} --tmpfs /dev/shm`);
    expect(args.at(-1)).toBe('/.capsule/capsule-agent');
  });

  it('binds everything under the private data directory from launcher fds, never by path', () => {
    const line = buildBwrapArgs(parseSpec({}), { ...base, resolvConfFd: 7, shareNetwork: true }).join(' ');
    expect(line).toContain('--bind-fd 4 /workspace');
    expect(line).toContain('--ro-bind-fd 5 /etc');
    expect(line).toContain('--ro-bind-fd 7 /etc/resolv.conf');
    expect(line).toContain('--ro-bind-fd 6 /.capsule');
    // The only host paths bwrap names are the system's own.
    const hostPaths = line.split(' ').filter((arg, i, all) => ['--bind', '--ro-bind'].includes(all[i - 1] ?? '') && arg.startsWith('/'));
    expect(hostPaths).toEqual(['/usr']);
  });

  it('sizes /dev/shm from limits.shmBytes and makes the rest of /dev read-only after it', () => {
    const args = buildBwrapArgs(parseSpec({ limits: { shmBytes: 2 * 2 ** 20 } }), base);
    const shm = args.indexOf('/dev/shm');
    expect(args.slice(shm - 3, shm + 1)).toEqual(['--size', String(2 * 2 ** 20), '--tmpfs', '/dev/shm']);
    expect(args.lastIndexOf('/dev')).toBeGreaterThan(shm);
  });

  it('binds host mounts from launcher fds and keeps the network when asked', () => {
    const spec = parseSpec({ mounts: [{ root: 'data', subpath: 'in', sandboxPath: '/input' }] });
    const args = buildBwrapArgs(spec, { ...base, mountFds: [10], shareNetwork: true });
    expect(args.join(' ')).toContain('--ro-bind-fd 10 /input');
    expect(args).not.toContain('--unshare-net');
  });
});
