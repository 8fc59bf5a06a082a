import type { SandboxSpec } from '../../sandbox-spec/index.js';
import { AGENT_PATH, SANDBOX_UID, STAGE_DIR, TOOLS_DIR } from '../../host/sandbox-layout.js';
import { ROOT_CAPABILITIES, STAGE } from '../namespace/bwrap-args.js';

/**
 * Host threads and stub processes of runsc itself (sentry, gofer, Go runtime) that share the
 * host pids cgroup with nothing else. Processes inside gVisor never appear on the host: their
 * count is bounded by RLIMIT_NPROC in the sentry, and the host pids.max is only a backstop
 * against a runaway sentry (hitting it panics the whole sandbox, so it sits well above).
 */
export const RUNSC_HOST_TASKS = 256;

/** Host pids.max for a gVisor sandbox: the spec's process limit plus runsc's own threads. */
export function hostPidsBackstop(pids: number): number {
  return 2 * pids + RUNSC_HOST_TASKS;
}

export interface OciBundleOptions {
  /** Host directory of the read-only root skeleton (mount points and the usr symlinks). */
  rootfsDir: string;
  /** Host path of the workspace, bound read-write at /workspace. */
  workspaceDir: string;
  /**
   * The sandbox's complete /etc, prepared once on the host (allowlisted copies and the synthetic
   * passwd, group, hosts, resolv.conf, hostname: HostPaths.sandboxEtcDir), bound in one mount.
   */
  etcDir: string;
  /** Host directory of Capsule's in-sandbox tools, bound read-only at TOOLS_DIR. */
  toolsDir: string;
  /**
   * Host uid (and gid) that the sandbox user 1000 maps to: files it writes in /workspace are
   * owned by it on the host, never by a real host account that happens to be uid 1000.
   */
  hostUid: number;
  /** cgroup path runsc joins (the sandbox's SandboxCgroup name, pre-created with the limits). */
  cgroupsPath: string;
  /** The program that runs as the container's init. @default [AGENT_PATH] */
  command?: readonly string[];
  /**
   * Host path of each spec mount, in the order of `spec.mounts`: where capsule-launch attaches
   * the resolved mount in runsc's private mount namespace (GvisorLayout.mountSource), never a
   * path a tenant named. @default [] (a spec with mounts then fails)
   */
  mountSources?: readonly string[];
  /**
   * Host path of each volume of `spec.volumes` (host template): where capsule-launch attaches the
   * tenant's volume (GvisorLayout.volumeSource). A template's are staged. @default []
   */
  volumeSources?: readonly string[];
  /** Host file bound at /etc/resolv.conf instead of Capsule's empty one (a network's resolver). */
  resolvConf?: string;
  /**
   * A sandbox from a template: its root snapshot is staged by capsule-launch under STAGE_DIR
   * through an idmapped mount (writable; /workspace inside), ids 0..65535 map to host
   * `hostBase`.., and the agent runs as root there with ROOT_CAPABILITIES (in gVisor's kernel).
   * No /usr, /etc or workspace binds. Absent: the host template.
   */
  template?: { hostBase: number; size: number };
  /**
   * A pre-made network namespace (the sandbox's egress namespace) the sandbox joins; runsc with
   * `--network=sandbox` drives its interface with gVisor's netstack. Without it: a new, empty one.
   */
  netnsPath?: string;
}

/** The subset of the OCI runtime spec Capsule writes; runsc reads it from `<bundle>/config.json`. */
export interface OciSpec {
  ociVersion: string;
  process: {
    user: { uid: number; gid: number; additionalGids: number[] };
    args: string[];
    env: string[];
    cwd: string;
    capabilities: Record<'bounding' | 'effective' | 'inheritable' | 'permitted' | 'ambient', string[]>;
    noNewPrivileges: boolean;
    rlimits: { type: string; hard: number; soft: number }[];
  };
  root: { path: string; readonly: boolean };
  hostname: string;
  mounts: { destination: string; type: string; source: string; options?: string[] }[];
  linux: {
    namespaces: { type: string; path?: string }[];
    uidMappings: { containerID: number; hostID: number; size: number }[];
    gidMappings: { containerID: number; hostID: number; size: number }[];
    resources: {
      memory: { limit: number; swap: number };
      cpu: { quota: number; period: number };
      pids: { limit: number };
    };
    cgroupsPath: string;
  };
}

const CPU_PERIOD_US = 100_000;

/**
 * The OCI spec of a gVisor sandbox, from the same SandboxSpec the namespace backend uses. Pure:
 * unit tests pin every isolation-relevant field. Nothing secret goes here (the process's
 * environment is empty: each exec carries its own through the agent).
 */
export function buildOciSpec(spec: SandboxSpec, options: OciBundleOptions): OciSpec {
  if (options.template !== undefined) return buildTemplateOciSpec(spec, options, options.template);
  const ro = ['rbind', 'ro', 'nosuid', 'nodev'];
  const mounts: OciSpec['mounts'] = [
    { destination: '/proc', type: 'proc', source: 'proc' },
    { destination: '/dev', type: 'tmpfs', source: 'tmpfs', options: ['nosuid', 'mode=755'] },
    // POSIX shared memory, sized like /tmp (gVisor's own /dev/shm is not writable by the user).
    { destination: '/dev/shm', type: 'tmpfs', source: 'tmpfs', options: ['nosuid', 'nodev', 'mode=1777', `size=${spec.limits.shmBytes}`] },
    { destination: '/usr', type: 'bind', source: '/usr', options: ro },
  ];
  // One bind: every mount is a gofer connection in runsc, and ~25 of them cost start-up time.
  mounts.push({ destination: '/etc', type: 'bind', source: options.etcDir, options: ro });
  if (options.resolvConf !== undefined) {
    mounts.push({ destination: '/etc/resolv.conf', type: 'bind', source: options.resolvConf, options: ro });
  }
  mounts.push(
    {
      destination: '/tmp',
      type: 'tmpfs',
      source: 'tmpfs',
      options: ['nosuid', 'nodev', 'mode=1777', `size=${spec.limits.tmpBytes}`],
    },
    { destination: '/workspace', type: 'bind', source: options.workspaceDir, options: ['rbind', 'rw', 'nosuid', 'nodev'] },
  );
  spec.mounts.forEach((mount, index) => {
    const source = options.mountSources?.[index];
    if (source === undefined) throw new Error(`no host source for mounts[${index}]`);
    // Not recursive: the launcher attached exactly the one checked mount there.
    mounts.push({ destination: mount.sandboxPath, type: 'bind', source, options: ['bind', 'ro', 'nosuid', 'nodev'] });
  });
  spec.volumes.forEach((volume, index) => {
    const source = options.volumeSources?.[index];
    if (source === undefined) throw new Error(`no host source for volumes[${index}]`);
    mounts.push({ destination: volume.path, type: 'bind', source, options: volumeOptions(volume.readOnly) });
  });
  mounts.push({ destination: TOOLS_DIR, type: 'bind', source: options.toolsDir, options: ro });

  const noCaps: string[] = [];
  return {
    ociVersion: '1.0.2',
    process: {
      user: { uid: SANDBOX_UID, gid: SANDBOX_UID, additionalGids: [] },
      args: [...(options.command ?? [AGENT_PATH])],
      env: [],
      cwd: '/workspace',
      capabilities: { bounding: noCaps, effective: noCaps, inheritable: noCaps, permitted: noCaps, ambient: noCaps },
      noNewPrivileges: true,
      rlimits: [
        { type: 'RLIMIT_FSIZE', hard: spec.limits.fileSizeBytes, soft: spec.limits.fileSizeBytes },
        { type: 'RLIMIT_NOFILE', hard: spec.limits.openFiles, soft: spec.limits.openFiles },
        // gVisor counts its own tasks per uid: every sandboxed process is uid 1000 in a kernel
        // of its own, so this is exactly the sandbox's process (and thread) limit.
        { type: 'RLIMIT_NPROC', hard: spec.limits.pids, soft: spec.limits.pids },
        { type: 'RLIMIT_CORE', hard: 0, soft: 0 },
      ],
    },
    root: { path: options.rootfsDir, readonly: true },
    hostname: 'sandbox',
    mounts,
    linux: {
      namespaces: ['pid', 'network', 'ipc', 'uts', 'mount', 'user'].map((type) =>
        type === 'network' && options.netnsPath !== undefined ? { type, path: options.netnsPath } : { type }),
      // Root stays root (host files under /usr show their real owner); the sandbox user is a
      // host uid of its own. Nobody inside can become root: no capabilities, noNewPrivileges.
      uidMappings: [
        { containerID: 0, hostID: 0, size: 1 },
        { containerID: SANDBOX_UID, hostID: options.hostUid, size: 1 },
      ],
      gidMappings: [
        { containerID: 0, hostID: 0, size: 1 },
        { containerID: SANDBOX_UID, hostID: options.hostUid, size: 1 },
      ],
      resources: {
        memory: { limit: spec.limits.memoryBytes, swap: spec.limits.memoryBytes },
        cpu: { quota: Math.max(1000, Math.round(spec.limits.cpus * CPU_PERIOD_US)), period: CPU_PERIOD_US },
        pids: { limit: hostPidsBackstop(spec.limits.pids) },
      },
      cgroupsPath: options.cgroupsPath.startsWith('/') ? options.cgroupsPath : `/${options.cgroupsPath}`,
    },
  };
}

/** The OCI spec of a sandbox from a template: its own writable root, root inside, a 65536-id range. */
function buildTemplateOciSpec(spec: SandboxSpec, options: OciBundleOptions, template: { hostBase: number; size: number }): OciSpec {
  // runsc's gofer runs as the sandbox's host range here: it cannot traverse the 0700 data
  // directory, so the root, the tools, a resolv.conf and host mounts are all staged by
  // capsule-launch under STAGE_DIR, in runsc's private mount namespace.
  const staged = (name: string) => `${STAGE_DIR}/${name}`;
  const ro = ['rbind', 'ro', 'nosuid', 'nodev'];
  const mounts: OciSpec['mounts'] = [
    { destination: '/proc', type: 'proc', source: 'proc' },
    { destination: '/dev', type: 'tmpfs', source: 'tmpfs', options: ['nosuid', 'mode=755'] },
    { destination: '/dev/shm', type: 'tmpfs', source: 'tmpfs', options: ['nosuid', 'nodev', 'mode=1777', `size=${spec.limits.shmBytes}`] },
  ];
  if (options.resolvConf !== undefined) mounts.push({ destination: '/etc/resolv.conf', type: 'bind', source: staged(STAGE.resolvConf), options: ro });
  mounts.push({ destination: '/tmp', type: 'tmpfs', source: 'tmpfs', options: ['nosuid', 'nodev', 'mode=1777', `size=${spec.limits.tmpBytes}`] });
  spec.mounts.forEach((mount, index) => {
    mounts.push({ destination: mount.sandboxPath, type: 'bind', source: staged(STAGE.mount(index)), options: ['bind', 'ro', 'nosuid', 'nodev'] });
  });
  spec.volumes.forEach((volume, index) => {
    mounts.push({ destination: volume.path, type: 'bind', source: staged(STAGE.volume(index)), options: volumeOptions(volume.readOnly) });
  });
  mounts.push({ destination: TOOLS_DIR, type: 'bind', source: staged(STAGE.tools), options: ro });
  const caps = [...ROOT_CAPABILITIES];
  const range = { containerID: 0, hostID: template.hostBase, size: template.size };
  const base = buildOciSpec(spec, { ...options, template: undefined, volumeSources: spec.volumes.map((_, index) => staged(STAGE.volume(index))) });
  return {
    ...base,
    process: {
      ...base.process,
      user: { uid: 0, gid: 0, additionalGids: [] },
      cwd: '/workspace',
      // Root's capabilities in gVisor's kernel only: it starts each process as the user it names.
      capabilities: { bounding: caps, effective: caps, inheritable: [], permitted: caps, ambient: [] },
    },
    root: { path: staged(STAGE.root), readonly: false },
    mounts,
    linux: { ...base.linux, uidMappings: [range], gidMappings: [range] },
  };
}

/** A volume's bind: exactly the launcher's attached mount (not recursive), read-only when asked. */
function volumeOptions(readOnly: boolean): string[] {
  return ['bind', readOnly ? 'ro' : 'rw', 'nosuid', 'nodev'];
}

export type RunscPlatform = 'systrap' | 'ptrace';

export interface RunscFlagsOptions {
  /** runsc's state directory for this Capsule instance. */
  rootDir: string;
  platform: RunscPlatform;
  /** `none`: loopback only. `sandbox`: gVisor's netstack on the network namespace runsc runs in. */
  network: 'none' | 'sandbox';
  /** Directory for runsc's own debug logs; only when debugging. */
  debugLogDir?: string;
}

/** runsc's global flags, in front of every subcommand of one Capsule instance. */
export function buildRunscFlags(options: RunscFlagsOptions): string[] {
  const flags = [
    '--root', options.rootDir,
    '--rootless=false',
    `--platform=${options.platform}`,
    `--network=${options.network}`,
    // The root is read-only and writable places are explicit mounts: no overlay is needed.
    '--overlay2=none',
  ];
  if (options.debugLogDir !== undefined) flags.push('--debug', `--debug-log=${options.debugLogDir}/`);
  return flags;
}
