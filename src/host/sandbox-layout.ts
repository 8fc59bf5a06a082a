/**
 * What every sandbox looks like from inside, whatever its backend: the uid and user of its
 * processes, where Capsule's own tools are, which host /etc files it sees, and the environment a
 * process starts from. The host prepares these; backends bind them; the engine starts processes in them.
 */

/** Host files under /etc that programs need and that hold nothing about the host worth hiding. */
export const ETC_ALLOWLIST = [
  'alternatives', 'ld.so.cache', 'ld.so.conf', 'ld.so.conf.d', 'ssl', 'ca-certificates',
  'ca-certificates.conf', 'localtime', 'nsswitch.conf', 'protocols', 'services', 'mime.types',
  'gai.conf', 'profile', 'bash.bashrc', 'inputrc', 'terminfo', 'magic', 'magic.mime',
  'python3', 'python3.11', 'matplotlibrc', 'fonts', 'gitconfig', 'environment', 'login.defs',
] as const;

/** The uid and gid every sandboxed process has inside its user namespace. */
export const SANDBOX_UID = 1000;
export const SANDBOX_USER = 'user';
/** Capsule's own read-only tools inside the sandbox (the agent, interpreter drivers). */
export const TOOLS_DIR = '/.capsule';
/** Where the resident agent lives inside the sandbox. */
export const AGENT_PATH = `${TOOLS_DIR}/capsule-agent`;

/**
 * A directory that exists empty on the host; in each sandbox launcher's own mount namespace a
 * small tmpfs covers it, holding detached mounts of the sandbox's workspace, /etc, tools,
 * resolv.conf and host mounts (capsule-launch --stage/--attach). bubblewrap runs unprivileged
 * and binds by path: these are the only paths it binds that are not the system's own, and no
 * other process on the host can see them.
 */
export const STAGE_DIR = '/run/capsule-stage';

/**
 * The environment every process starts from; the spec's env and the call's env go on top. In a
 * sandbox from a template the agent adds HOME, USER and LOGNAME of the user a process runs as
 * (from the template's /etc/passwd); the host template has one user, named here.
 */
export function baseEnv(template?: string): Record<string, string> {
  const common = { PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin', LANG: 'C.UTF-8' };
  if (template !== undefined && template !== 'host') return common;
  return {
    PATH: '/usr/local/bin:/usr/bin:/bin',
    HOME: '/workspace',
    USER: SANDBOX_USER,
    LOGNAME: SANDBOX_USER,
    LANG: 'C.UTF-8',
    SHELL: '/bin/bash',
  };
}
