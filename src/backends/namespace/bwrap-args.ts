import type { SandboxSpec } from '../../spec/index.js';
import { AGENT_PATH, SANDBOX_UID, SANDBOX_USER, TOOLS_DIR } from '../../host/sandbox-layout.js';

/** Fds the launcher opens for bwrap: the seccomp program, then one per read-only mount. */
export const SECCOMP_FD = 3;
export const FIRST_MOUNT_FD = 10;

export interface BwrapOptions {
  /** Host path of the workspace, bound read-write at /workspace. */
  workspaceDir: string;
  /** Host directory that is the sandbox's whole /etc (HostPaths.sandboxEtcDir). */
  sandboxEtcDir: string;
  /** Fd on which bwrap reads the seccomp program. */
  seccompFd: number;
  /**
   * Fd of each spec mount's host directory, opened by the launcher as root, so that the sandbox
   * uid need not be able to traverse the directory's parents (bwrap --ro-bind-fd).
   */
  mountFds: readonly number[];
  /** When false, bwrap makes a fresh empty network namespace; when true, the caller's is kept. */
  shareNetwork: boolean;
  /** Host file bound at /etc/resolv.conf instead of the no-resolver one (the egress proxy's resolver). */
  resolvConf?: string;
  /** Host directory of Capsule's in-sandbox tools, bound read-only at TOOLS_DIR. */
  toolsDir: string;
  /** The program bwrap runs as the sandbox's first process. @default [AGENT_PATH] */
  command?: readonly string[];
}

/**
 * The bubblewrap argv for a sandbox. Pure: the same spec gives the same argv, so unit tests pin
 * the isolation flags. Nothing secret goes here: /proc/1/cmdline inside shows every argument.
 */
export function buildBwrapArgs(spec: SandboxSpec, options: BwrapOptions): string[] {
  const args = [
    '--unshare-user', '--unshare-pid', '--unshare-ipc', '--unshare-uts', '--unshare-cgroup',
    ...(options.shareNetwork ? [] : ['--unshare-net']),
    '--disable-userns',
    '--die-with-parent', '--new-session', '--cap-drop', 'ALL',
    '--uid', String(SANDBOX_UID), '--gid', String(SANDBOX_UID),
    '--hostname', 'sandbox',
    '--ro-bind', '/usr', '/usr',
    '--symlink', 'usr/bin', '/bin', '--symlink', 'usr/sbin', '/sbin',
    '--symlink', 'usr/lib', '/lib', '--symlink', 'usr/lib64', '/lib64',
    '--proc', '/proc', '--dev', '/dev',
  ];
  // One bind for all of /etc: allowlisted copies and Capsule's own passwd, group, hosts.
  args.push('--ro-bind', options.sandboxEtcDir, '/etc');
  if (options.resolvConf) args.push('--ro-bind', options.resolvConf, '/etc/resolv.conf');
  args.push(
    '--size', String(spec.limits.tmpBytes), '--tmpfs', '/tmp',
    '--dir', '/var', '--symlink', '../tmp', '/var/tmp',
    '--bind', options.workspaceDir, '/workspace',
    '--dir', '/home', '--symlink', '/workspace', `/home/${SANDBOX_USER}`,
  );
  spec.mounts.forEach((mount, index) => {
    const fd = options.mountFds[index];
    if (fd === undefined) throw new Error(`no fd for mount ${mount.sandboxPath}`);
    args.push('--ro-bind-fd', String(fd), mount.sandboxPath);
  });
  args.push('--ro-bind', options.toolsDir, TOOLS_DIR);
  // bwrap builds the root on a tmpfs; nothing outside /workspace and /tmp may be written.
  args.push('--remount-ro', '/');
  const command = options.command ?? [AGENT_PATH];
  args.push('--chdir', '/workspace', '--clearenv', '--seccomp', String(options.seccompFd), '--', ...command);
  return args;
}
