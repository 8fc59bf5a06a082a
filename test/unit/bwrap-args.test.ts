import { describe, expect, it } from 'vitest';
import { buildBwrapArgs } from '../../src/backends/namespace/bwrap-args.js';
import { parseSpec } from '../../src/sandbox-spec/index.js';

const base = { stageDir: '/run/stage', seccompFd: 3, shareNetwork: false };

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

  it('binds what lives in the private data directory from the launcher\'s stage, never by its path', () => {
    const line = buildBwrapArgs(parseSpec({}), { ...base, hasResolvConf: true, shareNetwork: true }).join(' ');
    expect(line).toContain('--bind /run/stage/workspace /workspace');
    expect(line).toContain('--ro-bind /run/stage/etc /etc');
    expect(line).toContain('--ro-bind /run/stage/resolv.conf /etc/resolv.conf');
    expect(line).toContain('--ro-bind /run/stage/tools /.capsule');
    // Besides the stage, the only host path bwrap names is the system's own /usr.
    const hostPaths = line.split(' ').filter((arg, i, all) => ['--bind', '--ro-bind'].includes(all[i - 1] ?? '') && !arg.startsWith('/run/stage/'));
    expect(hostPaths).toEqual(['/usr']);
  });

  it('sizes /dev/shm from limits.shmBytes and makes the rest of /dev read-only after it', () => {
    const args = buildBwrapArgs(parseSpec({ limits: { shmBytes: 2 * 2 ** 20 } }), base);
    const shm = args.indexOf('/dev/shm');
    expect(args.slice(shm - 3, shm + 1)).toEqual(['--size', String(2 * 2 ** 20), '--tmpfs', '/dev/shm']);
    expect(args.lastIndexOf('/dev')).toBeGreaterThan(shm);
  });

  it('binds host mounts from the stage and keeps the network when asked', () => {
    const spec = parseSpec({ mounts: [{ root: 'data', subpath: 'in', sandboxPath: '/input' }] });
    const args = buildBwrapArgs(spec, { ...base, shareNetwork: true });
    expect(args.join(' ')).toContain('--ro-bind /run/stage/mount-0 /input');
    expect(args).not.toContain('--unshare-net');
  });
});
