import type { SandboxSpec } from '../../sandbox-spec/index.js';
import { AGENT_PATH, SANDBOX_UID, SANDBOX_USER, TOOLS_DIR } from '../../host/sandbox-layout.js';

/**
 * Fds the launcher opens as root: the seccomp program; the workspace, the prepared /etc, the tools
 * and a network's resolv.conf, which live under Capsule's private data directory (0700: the
 * sandbox's uid cannot reach them by path); then one per host mount. All but the seccomp program
 * are shown to bwrap under STAGE_DIR (see STAGE).
 */
export const SECCOMP_FD = 3;
export const WORKSPACE_FD = 4;
export const ETC_FD = 5;
export const TOOLS_FD = 6;
export const RESOLV_CONF_FD = 7;
/** A sandbox from a template: its root subvolume, and the user namespace bwrap joins (--userns). */
export const ROOT_FD = 8;
export const USERNS_FD = 9;
export const FIRST_MOUNT_FD = 10;
/** After the at most 16 host mounts: one per volume. */
export const FIRST_VOLUME_FD = FIRST_MOUNT_FD + 16;

/**
 * What root inside a sandbox from a template may do, in its own user namespace only: own and
 * chown files, change users (dpkg, su), signal its processes, bind low ports. No CAP_SYS_ADMIN,
 * no CAP_SYS_RESOURCE (RLIMIT_NPROC holds for root too), nothing that reaches the host.
 */
export const ROOT_CAPABILITIES = [
  'CAP_CHOWN', 'CAP_DAC_OVERRIDE', 'CAP_DAC_READ_SEARCH', 'CAP_FOWNER', 'CAP_FSETID', 'CAP_SETUID',
  'CAP_SETGID', 'CAP_KILL', 'CAP_SETFCAP', 'CAP_NET_BIND_SERVICE', 'CAP_AUDIT_WRITE',
] as const;

/** Names under STAGE_DIR. */
export const STAGE = {
  workspace: 'workspace',
  etc: 'etc',
  tools: 'tools',
  resolvConf: 'resolv.conf',
  root: 'root',
  mount: (index: number) => `mount-${index}`,
  volume: (index: number) => `volume-${index}`,
} as const;

export interface BwrapOptions {
  /** Where the launcher staged the sandbox's private directories (STAGE_DIR in its namespace). */
  stageDir: string;
  /** Fd on which bwrap reads the seccomp program. */
  seccompFd: number;
  /** When false, bwrap makes a fresh empty network namespace; when true, the caller's is kept. */
  shareNetwork: boolean;
  /** A network's resolv.conf is staged and bound over the no-resolver one (the egress proxy's resolver). */
  hasResolvConf?: boolean;
  /** The program bwrap runs as the sandbox's first process. @default [AGENT_PATH] */
  command?: readonly string[];
  /**
   * A sandbox from a template: its root is the staged snapshot (STAGE.root, seen through the
   * launcher's idmapped mount), bwrap joins the user namespace at this fd, and the first process
   * runs as root there (with ROOT_CAPABILITIES, in that namespace only). Else: the host's /usr.
   */
  templateUsernsFd?: number;
}

/**
 * The bubblewrap argv for a sandbox. Pure: the same spec gives the same argv, so unit tests pin
 * the isolation flags. Nothing secret goes here: /proc/1/cmdline inside shows every argument.
 */
export function buildBwrapArgs(spec: SandboxSpec, options: BwrapOptions): string[] {
  if (options.templateUsernsFd !== undefined) return buildTemplateBwrapArgs(spec, options, options.templateUsernsFd);
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
    // POSIX shared memory: a sized tmpfs like /tmp (the rest of /dev is made read-only below).
    '--size', String(spec.limits.shmBytes), '--tmpfs', '/dev/shm',
  ];
  const staged = (name: string) => `${options.stageDir}/${name}`;
  // One bind for all of /etc: allowlisted copies and Capsule's own passwd, group, hosts.
  args.push('--ro-bind', staged(STAGE.etc), '/etc');
  if (options.hasResolvConf) args.push('--ro-bind', staged(STAGE.resolvConf), '/etc/resolv.conf');
  args.push(
    '--size', String(spec.limits.tmpBytes), '--tmpfs', '/tmp',
    '--dir', '/var', '--symlink', '../tmp', '/var/tmp',
    '--bind', staged(STAGE.workspace), '/workspace',
    '--dir', '/home', '--symlink', '/workspace', `/home/${SANDBOX_USER}`,
  );
  // Host mounts: the launcher resolved each beneath its root and staged it read-only.
  spec.mounts.forEach((mount, index) => args.push('--ro-bind', staged(STAGE.mount(index)), mount.sandboxPath));
  spec.volumes.forEach((volume, index) => args.push(volume.readOnly ? '--ro-bind' : '--bind', staged(STAGE.volume(index)), volume.path));
  args.push('--ro-bind', staged(STAGE.tools), TOOLS_DIR);
  // bwrap builds the root and /dev on tmpfs; nothing outside /workspace, /tmp and /dev/shm may
  // be written (each remount is of that one mount: the binds and tmpfs above keep their own).
  args.push('--remount-ro', '/', '--remount-ro', '/dev');
  args.push('--chdir', '/workspace', '--clearenv', '--seccomp', String(options.seccompFd), ...commandArgs(options));
  return args;
}

/**
 * The command after bwrap's options. The agent runs as the namespace's pid 1 (`--as-pid-1`): it
 * reaps every orphan itself (a subreaper already), so bwrap's own init would be one more process
 * per sandbox for nothing; and as init, the kernel drops every signal sent to it from inside the
 * sandbox that it has no handler for, SIGKILL included, so sandbox code cannot kill its agent.
 * Another command keeps bwrap's init.
 */
function commandArgs(options: BwrapOptions): string[] {
  return options.command ? ['--', ...options.command] : ['--as-pid-1', '--', AGENT_PATH];
}

/** The argv of a sandbox from a template: root inside a user namespace with a 65536-id range. */
function buildTemplateBwrapArgs(spec: SandboxSpec, options: BwrapOptions, usernsFd: number): string[] {
  const staged = (name: string) => `${options.stageDir}/${name}`;
  // --userns: the launcher made the namespace (a range, root-written maps), owned by the uid bwrap
  // runs as. Nested user namespaces stay impossible: seccomp refuses unshare and clone(NEWUSER).
  const args = [
    '--userns', String(usernsFd), '--uid', '0', '--gid', '0',
    '--unshare-pid', '--unshare-ipc', '--unshare-uts', '--unshare-cgroup',
    ...(options.shareNetwork ? [] : ['--unshare-net']),
    '--die-with-parent', '--new-session',
    '--cap-drop', 'ALL', ...ROOT_CAPABILITIES.flatMap((cap) => ['--cap-add', cap]),
    '--hostname', 'sandbox',
    // The sandbox's own copy-on-write root, writable: apt-get works, nothing else sees it.
    '--bind', staged(STAGE.root), '/',
    '--proc', '/proc', '--dev', '/dev',
    '--perms', '1777', '--size', String(spec.limits.shmBytes), '--tmpfs', '/dev/shm',
  ];
  if (options.hasResolvConf) args.push('--ro-bind', staged(STAGE.resolvConf), '/etc/resolv.conf');
  args.push('--perms', '1777', '--size', String(spec.limits.tmpBytes), '--tmpfs', '/tmp');
  spec.mounts.forEach((mount, index) => args.push('--ro-bind', staged(STAGE.mount(index)), mount.sandboxPath));
  spec.volumes.forEach((volume, index) => args.push(volume.readOnly ? '--ro-bind' : '--bind', staged(STAGE.volume(index)), volume.path));
  args.push('--ro-bind', staged(STAGE.tools), TOOLS_DIR, '--remount-ro', '/dev');
  args.push('--chdir', '/workspace', '--clearenv', '--seccomp', String(options.seccompFd), ...commandArgs(options));
  return args;
}
