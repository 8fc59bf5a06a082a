import type { NetworkPolicy, SandboxSpec } from '../../sandbox-spec/index.js';
import type { EgressStats } from '../../host/egress/egress-proxy.js';
import type { HostMount } from '../../host/mount-roots.host.js';
import { STAGE_DIR } from '../../host/sandbox-layout.js';
import { launchMountArgs } from '../host-mounts.js';
import { FIRST_MOUNT_FD, FIRST_VOLUME_FD, RESOLV_CONF_FD, ROOT_FD, STAGE, TOOLS_FD } from '../namespace/bwrap-args.js';

/** A network namespace made for one sandbox; runsc runs inside it with gVisor's own netstack. */
export interface NetworkAttachment {
  /** The namespace file, e.g. /run/netns/capsule-<id>. */
  path: string;
  /** resolv.conf bound at /etc/resolv.conf (the proxy's resolver). */
  resolvConf?: string;
  /** Environment every process starts from (proxy settings); a request's env goes on top. */
  env?: Record<string, string>;
  /** Replaces the sandbox's egress policy; new connections follow it at once. */
  setPolicy?(policy: NetworkPolicy): void;
  /** Denied and over-limit connections so far (the egress proxy's counters). */
  stats?(): EgressStats | undefined;
  release(): Promise<void>;
  /** Lets go of a namespace the sandbox keeps while it runs on without this server (see EgressNetwork.letGo). */
  letGo?(): void;
}

/** A sandbox from a template: its root, its id range, Capsule's tools (all staged by the launcher). */
export interface TemplateLaunch {
  rootDir: string;
  hostBase: number;
  size: number;
  toolsDir: string;
}

export interface GvisorLaunchOptions {
  spec: SandboxSpec;
  cgroup2Dir: string;
  dataDir: string;
  mounts: readonly HostMount[];
  /** Host directories of `spec.volumes`, in its order. */
  volumes: readonly string[];
  /** Where a host-template sandbox's mount `index` and volume `index` are attached (bundle paths). */
  mountSource: (index: number) => string;
  volumeSource: (index: number) => string;
  template: TemplateLaunch | undefined;
  network: NetworkAttachment | undefined;
  /** runsc and its global flags, then the subcommand. */
  runsc: readonly string[];
}

/**
 * runsc up to 2024-07 refuses `--network=sandbox` when /proc/sys/net/core/rmem_default exists in
 * the namespace it scrapes: its test for "the root network namespace". Linux 6.x namespaced that
 * sysctl, so it now exists in every namespace and the test is always true. runsc (only runsc:
 * its own sandbox pivots away from the host's /proc) therefore runs in a mount namespace of its
 * own where /proc/sys/net/core is an empty tmpfs. bwrap as root makes that namespace and keeps all
 * capabilities and every other namespace of the caller (the netns capsule-launch entered).
 */
function hideRootNetnsMarker(): string[] {
  return ['/usr/bin/bwrap', '--dev-bind', '/', '/', '--tmpfs', '/proc/sys/net/core', '--cap-add', 'ALL', '--'];
}

/**
 * capsule-launch's argv for one runsc command (run or restore) of a sandbox. It forks runsc into
 * the sandbox's v2 cgroup (a migration would wait for an RCU grace period) and attaches every
 * directory runsc's gofer serves in a mount namespace of runsc's own: host mounts, volumes and,
 * for a template, the root (idmapped through a user namespace with the sandbox's range), the tools
 * and a network's resolv.conf under STAGE_DIR. The gofer opens those as the paths in the bundle,
 * where nothing can swap them.
 */
export function gvisorLaunchArgs(options: GvisorLaunchOptions): string[] {
  const { spec, template, network } = options;
  const idmap = template !== undefined ? ':idmap' : '';
  // A template's volumes through the idmapped view (stored with raw ids); the host template's as
  // they are (lent to the sandbox's uid while it writes them).
  const volumes = options.volumes.flatMap((dir, index) => [
    '--fd', `${FIRST_VOLUME_FD + index}:${dir}`,
    '--attach', `${FIRST_VOLUME_FD + index}:${spec.volumes[index]?.readOnly ? 'ro' : 'rw'}${idmap}`, template ? STAGE.volume(index) : options.volumeSource(index),
  ]);
  const staged = template
    ? [
        '--stage', STAGE_DIR,
        '--userns', `${template.hostBase}:${template.size}`,
        '--fd', `${ROOT_FD}:${template.rootDir}`, '--attach', `${ROOT_FD}:rw:idmap`, STAGE.root,
        '--fd', `${TOOLS_FD}:${template.toolsDir}`, '--attach', `${TOOLS_FD}:ro`, STAGE.tools,
        ...(network?.resolvConf !== undefined ? ['--fd', `${RESOLV_CONF_FD}:${network.resolvConf}`, '--attach', `${RESOLV_CONF_FD}:ro`, STAGE.resolvConf] : []),
        ...launchMountArgs(options.mounts, FIRST_MOUNT_FD, STAGE.mount),
      ]
    : launchMountArgs(options.mounts, FIRST_MOUNT_FD, options.mountSource);
  return [
    '--cgroup2-dir', options.cgroup2Dir,
    // runsc's gofer opens bundle mount sources as root: each is the launcher's checked mount.
    '--forbid', options.dataDir,
    ...staged,
    ...volumes,
    ...(network ? ['--netns', network.path] : []),
    '--', ...(network ? hideRootNetnsMarker() : []),
    ...options.runsc,
  ];
}
