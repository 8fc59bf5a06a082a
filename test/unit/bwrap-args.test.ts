import { describe, expect, it } from 'vitest';
import { buildBwrapArgs } from '../../src/backends/namespace/bwrap-args.js';
import { parseSpec } from '../../src/spec/index.js';

const base = { workspaceDir: '/v/ws-x', sandboxEtcDir: '/d/sandbox-etc', seccompFd: 3, mountFds: [], toolsDir: '/d/bin', shareNetwork: false };

describe('bwrap argv', () => {
  it('pins the isolation flags', () => {
    const args = buildBwrapArgs(parseSpec({}), base);
    for (const flag of ['--unshare-user', '--unshare-pid', '--unshare-ipc', '--unshare-uts', '--unshare-cgroup', '--unshare-net', '--disable-userns', '--die-with-parent', '--new-session', '--clearenv']) {
      expect(args).toContain(flag);
    }
    expect(args.join(' ')).toContain('--cap-drop ALL');
    expect(args.join(' ')).toContain('--seccomp 3');
    expect(args.join(' ')).toContain('--remount-ro /');
    expect(args.join(' ')).toContain('--bind /v/ws-x /workspace');
    expect(args.join(' ')).toContain(`--size ${64 * 2 ** 20} --tmpfs /tmp`);
    expect(args.join(' ')).toContain('--ro-bind /d/sandbox-etc /etc');
    expect(args.at(-1)).toBe('/.capsule/capsule-agent');
  });

  it('binds read-only mounts from launcher fds and keeps the network when asked', () => {
    const spec = parseSpec({ mounts: [{ hostPath: '/data/in', sandboxPath: '/input' }] });
    const args = buildBwrapArgs(spec, { ...base, mountFds: [10], shareNetwork: true });
    expect(args.join(' ')).toContain('--ro-bind-fd 10 /input');
    expect(args).not.toContain('--unshare-net');
    expect(args.join(' ')).not.toContain('/data/in');
  });
});
