import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { createHash } from 'node:crypto';
import type { AgentRelay } from '../agent/index.js';
import type { AgentClient, AgentProcess } from '../agent/index.js';
import { pipedHolder, reattachHolder, supervisedHolder, type AgentHolder } from './agent-holder.host.js';
import { listSupervised, logTail, removeSupervisor, supervisorFiles, supervisorState, unansweredSupervisor } from './supervisor.host.js';
import { SandboxError } from '../../errors/index.js';
import { SandboxCgroup, listSandboxCgroups } from '../../host/cgroups.host.js';
import type { HostEnvironment, HostPaths } from '../../host/host-env.host.js';
import type { NetworkPolicy, SandboxSpec } from '../../sandbox-spec/index.js';
// Types only: the egress network (proxy, resolver, nftables, netns pool) is loaded by the first
// sandbox that has a network, so that a one-shot run without one does not load it.
import type { EgressNetwork, NetworkAttachment } from '../../host/netns-network.host.js';
import { networkPrerequisitesProblem } from '../../host/network-prerequisites.host.js';
import { egressCounters } from '../../host/egress/egress-types.js';
import type { Backend, BackendProbe, BackendSandbox, Capability, ConnectPortOptions, CreateOptions, ExecRequest, PauseOptions, PauseResult, ReattachOptions, ReconcileReport, SandboxCounters } from '../backend.js';
import type { HostMount } from '../../host/mount-roots.host.js';
import { STAGE_DIR } from '../../host/sandbox-layout.js';
import { RANGE_SIZE } from '../../host/uid-ranges.js';
import { buildBwrapArgs, ETC_FD, FIRST_MOUNT_FD, FIRST_VOLUME_FD, RESOLV_CONF_FD, ROOT_FD, SECCOMP_FD, STAGE, TOOLS_FD, USERNS_FD, WORKSPACE_FD } from './bwrap-args.js';
import { hostMountsOf, launchMountArgs, mountRefusal } from '../host-mounts.js';
import { lendVolume, returnVolume } from '../../host/stored-disks.host.js';
import { volumesOf } from '../volumes.js';

/** Host uids for sandboxes come from this range; each live sandbox has its own. */
const UID_BASE = 3_000_000;
const UID_RANGE = 1_000_000;
const AGENT_READY_TIMEOUT_MS = 10_000;
/** How long after its start a sandbox stops having the host first (afterFirstCommand), at the most. */
const DEFAULT_FIRST_COMMAND_GRACE_MS = 100;

const CAPABILITIES: readonly Capability[] = [
  'limits.cpus', 'limits.memory', 'limits.pids', 'limits.disk', 'limits.fileSize',
  'limits.openFiles', 'limits.tmp', 'mounts.readOnly', 'network.none', 'pause.freeze', 'volumes',
];

export interface NamespaceBackendOptions {
  host: HostEnvironment;
  /** Networking for specs that grant some (netns pool, egress proxy, broker). @default made on first use */
  network?: EgressNetwork;
  /**
   * Each sandbox is held by a supervisor daemon (capsule-launch --supervise) instead of this
   * process: it keeps running when the server dies, and a new server reattaches to it
   * (`reattach`). @default false (sandboxes die with the server)
   */
  supervise?: boolean;
  /**
   * How long after its start a sandbox from a template has the host to itself at the most: its
   * layer's next spare is made when its first command ends, or then (StartOptions.afterFirstCommand).
   * @default 100
   */
  firstCommandGraceMs?: number;
}

/**
 * bubblewrap + seccomp + cgroups: each sandbox is a user, pid, ipc, uts, cgroup, mount and network
 * namespace around a resident agent, run by capsule-launch as a host uid of its own.
 */
export class NamespaceBackend implements Backend {
  readonly name = 'namespace' as const;
  private readonly host: HostEnvironment;
  private readonly uidsInUse = new Set<number>();
  private network: EgressNetwork | undefined;
  private readonly supervise: boolean;
  private readonly firstCommandGraceMs: number;

  constructor(options: NamespaceBackendOptions) {
    this.host = options.host;
    this.network = options.network;
    this.supervise = options.supervise === true;
    this.firstCommandGraceMs = options.firstCommandGraceMs ?? DEFAULT_FIRST_COMMAND_GRACE_MS;
  }

  /** Stops this backend's networking (proxy, pool, host rules); sandboxes must be destroyed first. */
  async close(): Promise<void> {
    await this.network?.close();
  }

  private async egress(): Promise<EgressNetwork> {
    if (this.network) return this.network;
    const { EgressNetwork } = await import('../../host/netns-network.host.js');
    this.network ??= new EgressNetwork({ host: this.host });
    return this.network;
  }

  /** Warm sandboxes serve specs with no network and no mounts whose fixed-at-start limits match. */
  poolKey(spec: SandboxSpec): string | undefined {
    if (spec.network.mode !== 'none' || spec.mounts.length > 0 || spec.volumes.length > 0) return undefined;
    const { tmpBytes, shmBytes, fileSizeBytes, openFiles } = spec.limits;
    // The template and the user are fixed at start (the root, the agent's user namespace).
    return `namespace:tpl=${spec.template ?? 'host'}:user=${spec.user ?? ''}:tmp=${tmpBytes}:shm=${shmBytes}:fsize=${fileSizeBytes}:nofile=${openFiles}`;
  }

  async probe(): Promise<BackendProbe> {
    try {
      await this.host.ensure();
      // Networks need ip, nft and nsenter; without them only network.none is offered.
      const networked = (await networkPrerequisitesProblem()) === undefined;
      return { available: true, capabilities: networked ? [...CAPABILITIES, 'network.allowlist', 'network.internet'] : CAPABILITIES };
    } catch (error) {
      return { available: false, reason: (error as Error).message, capabilities: [] };
    }
  }

  async create(spec: SandboxSpec, options: CreateOptions): Promise<BackendSandbox> {
    const mounts = hostMountsOf(spec, options.mounts);
    const volumes = volumesOf(spec, options.volumes);
    const paths = await this.host.ensure();
    const template = options.template;
    // A sandbox from a template is recovered onto its root as it is (its layer is not needed).
    const fromTemplate = template !== undefined || (options.reuseWorkspace === true && (await this.host.volume.isRoot(options.id)));
    const uid = fromTemplate ? this.host.uidRanges.allocate(options.id) : this.allocateUid(options.id);
    const releaseUid = () => (fromTemplate ? this.host.uidRanges.release(options.id) : void this.uidsInUse.delete(uid));
    const cleanup: (() => Promise<void>)[] = [() => Promise.resolve(releaseUid())];
    try {
      const cgroup = await SandboxCgroup.create(this.host.cgroupPrefix, options.id, spec.limits);
      cleanup.push(() => cgroup.remove());
      const volume = this.host.volume;
      // A new bare workspace (empty, or a snapshot's clone) is made by the launcher itself
      // (ioctls, no spawn), with its owner and its quota, before the sandbox starts: such a
      // create pays no `btrfs` process.
      const from = options.workspaceFrom;
      const makeWorkspace = options.reuseWorkspace || template ? undefined : { from, spare: from === undefined ? undefined : volume.spares.pathOf(from) };
      const workspaceDir = options.reuseWorkspace
        ? await volume.adopt(options.id, spec.limits.diskBytes, uid)
        : template
          ? (await volume.createRoot(options.id, template.layerDir, { replenishLater: true })).workspace
          : volume.path(options.id);
      cleanup.push(() => volume.delete(options.id));
      // The host template's sandbox has one uid: its writable volumes are lent to it until it ends.
      const lent = fromTemplate ? [] : volumes.filter((_, index) => spec.volumes[index]?.readOnly !== true);
      for (const dir of lent) {
        cleanup.push(() => returnVolume(dir));
        await lendVolume(dir, uid);
      }
      const egress = spec.network.mode === 'none' ? undefined : await this.egress();
      const network = await egress?.attach(options.id, spec.network, options.tenantId);
      if (egress) cleanup.push(() => egress.detach(options.id));
      options.signal?.throwIfAborted();
      const starting = NamespaceSandbox.start({
        id: options.id, spec, paths, uid, cgroup, workspaceDir, makeWorkspace, network, egress, mounts, volumes, supervise: this.supervise,
        rootDir: fromTemplate ? volume.rootPath(options.id) : undefined,
        // A new root from a template gets its quota from the launcher, before the sandbox starts,
        // and the layer's next spare once the sandbox has run its first command.
        ...(template && !options.reuseWorkspace
          ? { rootLimitBytes: spec.limits.diskBytes, afterFirstCommand: { then: () => volume.spares.replenish(template.layerDir), graceMs: this.firstCommandGraceMs } }
          : {}),
        diskUsed: () => this.host.volume.usedBytes(options.id),
        setDiskLimit: (bytes) => this.host.volume.setLimit(options.id, bytes),
        release: async () => {
          releaseUid();
          try {
            await egress?.detach(options.id);
            for (const dir of lent) await returnVolume(dir);
          } finally {
            await this.host.volume.delete(options.id);
          }
        },
      });
      return await starting;
    } catch (error) {
      for (const step of cleanup.reverse()) await step().catch(() => undefined);
      // A spare it took is gone with it, and no first command of its will replenish the layer.
      if (template && !options.reuseWorkspace) this.host.volume.spares.replenish(template.layerDir);
      if (options.signal?.aborted) throw new SandboxError('ABORTED', `creating sandbox ${options.id} was aborted`, { cause: error });
      throw error;
    } finally {
      // The launcher took the snapshot's spare, or found none: the next create from it finds one.
      if (options.workspaceFrom !== undefined && !options.reuseWorkspace) this.host.volume.spares.replenish(options.workspaceFrom);
    }
  }

  /**
   * Takes over a sandbox whose supervisor outlived the previous server: the same cgroup,
   * workspace, processes, network namespace (its policy registered with this server's proxy
   * again) and volumes. Undefined when the sandbox never had a supervisor (a server without
   * supervision started it: `reconcile` removes what is left). SANDBOX_CRASHED, with the reason,
   * when it had one that is gone; another error when the host fails to take it over (its network,
   * a supervisor that does not answer): the engine then recovers it on its files.
   */
  async reattach(id: string, spec: SandboxSpec, options: ReattachOptions = {}): Promise<BackendSandbox | undefined> {
    const paths = await this.host.ensure();
    const held = await supervisorState(paths.dataDir, id);
    if (held.state === 'none') return undefined;
    if (held.state === 'ended') throw new SandboxError('SANDBOX_CRASHED', held.reason, { details: { sandboxId: id } });
    const volumes = volumesOf(spec, options.volumes);
    // The namespace first: the proxy refuses the sandbox's address until its policy is registered.
    const egress = spec.network.mode === 'none' ? undefined : await this.egress();
    const network = await egress?.reattach(id, spec.network, options.tenantId);
    const cgroup = SandboxCgroup.attach(`${this.host.cgroupPrefix}${id}`);
    // A sandbox paused with its memory is frozen, agent included: it thaws for the instant the
    // agent needs to answer the reattach (the freezer acts on the whole group), then freezes again.
    const frozen = await cgroup.isFrozen();
    if (frozen) await cgroup.freeze(false);
    const holder = await reattachHolder(paths.dataDir, id)
      .catch(() => undefined)
      .finally(() => (frozen ? cgroup.freeze(true).catch(() => undefined) : undefined));
    if (holder === undefined) {
      await egress?.detach(id).catch(() => undefined);
      throw await unansweredSupervisor(paths.dataDir, id);
    }
    const volume = this.host.volume;
    const fromTemplate = await volume.isRoot(id);
    let uid: number;
    try {
      uid = await this.reclaimUid(id, cgroup, fromTemplate);
    } catch (error) {
      await egress?.detach(id).catch(() => undefined);
      holder.detach();
      throw error;
    }
    const lent = fromTemplate ? [] : volumes.filter((_, index) => spec.volumes[index]?.readOnly !== true);
    return NamespaceSandbox.take(
      {
        id, spec, paths, uid, cgroup,
        workspaceDir: fromTemplate ? join(volume.rootPath(id), 'workspace') : volume.path(id),
        network, egress, mounts: options.mounts ?? [], volumes, supervise: true,
        rootDir: fromTemplate ? volume.rootPath(id) : undefined,
        diskUsed: () => volume.usedBytes(id),
        setDiskLimit: (bytes) => volume.setLimit(id, bytes),
        release: async () => {
          if (fromTemplate) this.host.uidRanges.release(id);
          else this.uidsInUse.delete(uid);
          try {
            await egress?.detach(id);
            for (const dir of lent) await returnVolume(dir);
          } finally {
            await volume.delete(id);
          }
        },
      },
      holder,
    );
  }

  async reconcile(liveIds: ReadonlySet<string>, reattached: ReadonlySet<string> = new Set()): Promise<ReconcileReport> {
    await this.host.ensure();
    const removed: string[] = [];
    const failures: string[] = [];
    // Supervisors nobody reattached to: their sandboxes are not ours any more.
    for (const id of await listSupervised(this.host.dataDir)) {
      if (reattached.has(id)) continue;
      try {
        await removeSupervisor(this.host.dataDir, id);
        removed.push(`supervisor:${id}`);
      } catch (error) {
        failures.push(`supervisor ${id}: ${(error as Error).message}`);
      }
    }
    for (const name of await listSandboxCgroups(this.host.cgroupPrefix)) {
      const id = name.slice(this.host.cgroupPrefix.length);
      if (reattached.has(id)) continue;
      try {
        await SandboxCgroup.attach(name).remove();
        removed.push(`cgroup:${id}`);
      } catch (error) {
        failures.push(`cgroup ${id}: ${(error as Error).message}`);
      }
    }
    for (const id of await this.host.volume.list()) {
      if (liveIds.has(id)) continue;
      try {
        await this.host.volume.delete(id);
        removed.push(`workspace:${id}`);
      } catch (error) {
        failures.push(`workspace ${id}: ${(error as Error).message}`);
      }
    }
    await this.host.volume.spares.clear();
    await this.host.volume.clearStaleQgroups();
    if ((await networkPrerequisitesProblem()) === undefined) {
      const { EgressNetwork } = await import('../../host/netns-network.host.js');
      const net = await EgressNetwork.reconcile(this.host, liveIds, this.network, reattached);
      removed.push(...net.removed);
      failures.push(...net.failures);
    }
    return { removed, failures };
  }

  /**
   * The host uid (or a template sandbox's range) a running sandbox taken over has: the one its
   * processes are mapped to, not one derived again from its id. A derived one can differ (two ids
   * whose uids collided were given theirs in the order they were created), and this server would
   * then hand the uid the sandbox really runs as to another sandbox once the one it mistook for
   * its holder ends. HOST_NOT_READY (the engine recovers it on its files, with a fresh uid) when
   * another sandbox holds it already.
   */
  private async reclaimUid(id: string, cgroup: SandboxCgroup, fromTemplate: boolean): Promise<number> {
    const running = await cgroup.mappedHostUid();
    if (running === undefined) return fromTemplate ? this.host.uidRanges.allocate(id) : this.allocateUid(id);
    const claimed = fromTemplate ? this.host.uidRanges.claim(id, running) : this.claimUid(running);
    if (!claimed) {
      throw new SandboxError('HOST_NOT_READY', `its processes run as host uid ${running}, which another sandbox of this server holds`, { details: { sandboxId: id, uid: running } });
    }
    return running;
  }

  private claimUid(uid: number): boolean {
    if (uid < UID_BASE || uid >= UID_BASE + UID_RANGE || this.uidsInUse.has(uid)) return false;
    this.uidsInUse.add(uid);
    return true;
  }

  /**
   * A host uid of its own for each live sandbox, derived from the id (a collision moves to the
   * next free one); a sandbox recovered on its files gets its workspace chowned to it.
   */
  private allocateUid(id: string): number {
    let uid = UID_BASE + (createHash('sha256').update(id).digest().readUInt32BE(0) % UID_RANGE);
    while (this.uidsInUse.has(uid)) uid = UID_BASE + ((uid - UID_BASE + 1) % UID_RANGE);
    this.uidsInUse.add(uid);
    return uid;
  }
}

interface StartOptions {
  id: string;
  spec: SandboxSpec;
  paths: HostPaths;
  /** The sandbox's host uid, or the first of its range (a sandbox from a template). */
  uid: number;
  /** A sandbox from a template: its root subvolume (the workspace is inside it). */
  rootDir: string | undefined;
  /**
   * A new root's disk limit, set by the launcher (an ioctl) before anything starts: only what the
   * sandbox writes counts, the template's shared extents do not.
   */
  rootLimitBytes?: number;
  /**
   * `then` is called once: when the sandbox's first command has ended, `graceMs` after its
   * start at the latest (a long first command then shares the host with it), or at its destroy,
   * whichever comes first. A template's next spare is made then: made
   * at once, its `btrfs` spawn (~3 ms of this process's event loop), commit and page-cache warm-up
   * shared the 2 cores with this sandbox's start and first command (create + first exec 17.8 ms
   * against 14.4 here, the first exec 5.0 against 2.4 from the host template).
   */
  afterFirstCommand?: { then: () => void; graceMs: number };
  cgroup: SandboxCgroup;
  workspaceDir: string;
  /**
   * The launcher makes `workspaceDir`: a new subvolume (empty, or a writable snapshot of `from`
   * whose files become the uid's, or `spare`, a ready snapshot of `from` it takes by a rename when
   * it is there), the uid's, 0700, its disk limit set.
   */
  makeWorkspace?: { from?: string; spare?: string };
  mounts: readonly HostMount[];
  /** Host directories of `spec.volumes`, in order. */
  volumes: readonly string[];
  diskUsed: () => Promise<number | undefined>;
  setDiskLimit: (bytes: number) => Promise<void>;
  network: NetworkAttachment | undefined;
  egress: EgressNetwork | undefined;
  release: () => Promise<void>;
  /** Held by a supervisor daemon that outlives this server (NamespaceBackendOptions.supervise). */
  supervise: boolean;
}

class NamespaceSandbox implements BackendSandbox {
  readonly backend = 'namespace' as const;
  readonly id: string;
  spec: SandboxSpec;
  readonly workspaceDir: string;
  readonly lost: Promise<void>;
  private readonly cgroup: SandboxCgroup;
  private readonly holder: AgentHolder;
  private readonly agent: AgentClient;
  private readonly release: () => Promise<void>;
  private readonly diskUsed: () => Promise<number | undefined>;
  private readonly setDiskLimit: (bytes: number) => Promise<void>;
  private readonly network: NetworkAttachment | undefined;
  private readonly egress: EgressNetwork | undefined;
  /**
   * From a template: the agent runs as root in the sandbox's user namespace, and a request that
   * names no user (the file helper, an interpreter) runs as the sandbox's user.
   */
  private readonly fromTemplate: boolean;
  /** Held by a supervisor daemon that outlives this server. */
  private readonly supervised: boolean;
  private destroying: Promise<void> | undefined;
  private afterFirstCommand: (() => void) | undefined;
  private firstCommandGrace: NodeJS.Timeout | undefined;

  private constructor(options: StartOptions, holder: AgentHolder) {
    this.id = options.id;
    this.spec = options.spec;
    this.workspaceDir = options.workspaceDir;
    this.cgroup = options.cgroup;
    this.release = options.release;
    this.diskUsed = options.diskUsed;
    this.setDiskLimit = options.setDiskLimit;
    this.network = options.network;
    this.egress = options.egress;
    this.holder = holder;
    this.supervised = options.supervise;
    this.agent = holder.agent;
    this.fromTemplate = options.rootDir !== undefined;
    this.lost = new Promise((resolve) => holder.agent.onLost(() => resolve()));
  }

  /** A sandbox an earlier server started, from its supervisor (NamespaceBackend.reattach). */
  static take(options: StartOptions, holder: AgentHolder): NamespaceSandbox {
    return new NamespaceSandbox(options, holder);
  }

  static async start(options: StartOptions): Promise<NamespaceSandbox> {
    const { spec, paths, uid, cgroup } = options;
    const resolvConf = options.network?.resolvConf;
    const rootDir = options.rootDir;
    const bwrapArgs = buildBwrapArgs(spec, {
      stageDir: STAGE_DIR,
      seccompFd: SECCOMP_FD,
      shareNetwork: options.network !== undefined,
      hasResolvConf: resolvConf !== undefined,
      ...(rootDir !== undefined ? { templateUsernsFd: USERNS_FD } : {}),
    });
    // A template's root through an idmapped mount, in a user namespace with a range of its own;
    // the host template's workspace and prepared /etc as single-uid binds.
    const own = rootDir !== undefined
      ? ['--userns', `${uid}:${RANGE_SIZE}:${USERNS_FD}`, '--fd', `${ROOT_FD}:${rootDir}`, '--attach', `${ROOT_FD}:rw:idmap`, STAGE.root]
      : [
          '--fd', `${WORKSPACE_FD}:${options.workspaceDir}`, '--attach', `${WORKSPACE_FD}:rw`, STAGE.workspace,
          '--fd', `${ETC_FD}:${paths.sandboxEtcDir}`, '--attach', `${ETC_FD}:ro`, STAGE.etc,
        ];
    const launchArgs = [
      ...(options.makeWorkspace ? ['--subvolume', `${uid}:${spec.limits.diskBytes}:${options.workspaceDir}`] : []),
      ...(options.makeWorkspace?.from !== undefined ? ['--subvolume-from', options.makeWorkspace.from] : []),
      ...(options.makeWorkspace?.spare !== undefined ? ['--subvolume-spare', options.makeWorkspace.spare] : []),
      ...(rootDir !== undefined && options.rootLimitBytes !== undefined ? ['--root-limit', `${options.rootLimitBytes}:${rootDir}`] : []),
      ...cgroup.launchArgs(),
      '--rlimit', `fsize=${spec.limits.fileSizeBytes}`,
      '--rlimit', `nofile=${spec.limits.openFiles}`,
      '--rlimit', 'core=0',
      ...(options.network ? ['--netns', options.network.netnsPath] : []),
      // Opened as root and staged where bwrap finds them: the data directory is 0700, the
      // sandbox's uid cannot reach anything in it by path.
      '--fd', `${SECCOMP_FD}:${paths.seccompBpf}`,
      '--stage', STAGE_DIR,
      ...own,
      '--fd', `${TOOLS_FD}:${paths.toolsDir}`, '--attach', `${TOOLS_FD}:ro`, STAGE.tools,
      ...(resolvConf !== undefined ? ['--fd', `${RESOLV_CONF_FD}:${resolvConf}`, '--attach', `${RESOLV_CONF_FD}:ro`, STAGE.resolvConf] : []),
      '--forbid', paths.dataDir,
      ...launchMountArgs(options.mounts, FIRST_MOUNT_FD, STAGE.mount),
      // Volumes: a template's through the idmapped view (stored with its raw ids), the host
      // template's as they are (lent to the sandbox's uid while it writes them).
      ...options.volumes.flatMap((dir, index) => [
        '--fd', `${FIRST_VOLUME_FD + index}:${dir}`,
        '--attach', `${FIRST_VOLUME_FD + index}:${spec.volumes[index]?.readOnly ? 'ro' : 'rw'}${rootDir !== undefined ? ':idmap' : ''}`, STAGE.volume(index),
      ]),
      '--uid', String(uid), '--gid', String(uid),
      '--', paths.bwrap, ...bwrapArgs,
    ];
    let holder: AgentHolder;
    let spawnError: Promise<never> = new Promise<never>(() => undefined);
    if (options.supervise) {
      try {
        holder = await supervisedHolder(paths.launcher, launchArgs, paths.dataDir, options.id);
      } catch (error) {
        throw startFailure(options, error, await supervisorLog(paths.dataDir, options.id));
      }
    } else {
      const piped = pipedHolder(paths.launcher, launchArgs);
      holder = piped;
      spawnError = piped.spawnError.catch((error: Error) => {
        throw new SandboxError('HOST_NOT_READY', `cannot start sandbox: ${error.message}`, { cause: error });
      });
    }
    const sandbox = new NamespaceSandbox(options, holder);
    const agent = holder.agent;
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new SandboxError('TIMEOUT', `sandbox ${options.id} did not start within ${AGENT_READY_TIMEOUT_MS} ms`)), AGENT_READY_TIMEOUT_MS);
    });
    try {
      await Promise.race([agent.ready, spawnError, timeout]);
    } catch (error) {
      const why = await holder.stderrTail();
      await sandbox.destroy().catch(() => undefined);
      throw startFailure(options, error, why);
    } finally {
      clearTimeout(timer);
    }
    if (options.afterFirstCommand) sandbox.awaitFirstCommand(options.afterFirstCommand.then, options.afterFirstCommand.graceMs);
    return sandbox;
  }

  private awaitFirstCommand(then: () => void, graceMs: number): void {
    this.afterFirstCommand = then;
    this.firstCommandGrace = setTimeout(() => this.firstCommandDone(), graceMs);
    this.firstCommandGrace.unref();
  }

  private firstCommandDone(): void {
    const then = this.afterFirstCommand;
    if (then === undefined) return;
    this.afterFirstCommand = undefined;
    clearTimeout(this.firstCommandGrace);
    then();
  }

  exec(request: ExecRequest): Promise<AgentProcess> {
    if (this.destroying) {
      return Promise.reject(new SandboxError('SANDBOX_NOT_RUNNING', `sandbox ${this.id} is being destroyed`));
    }
    // Proxy settings are the base of a networked sandbox's environment; the request may override.
    const withUser = this.fromTemplate ? { ...request, user: request.user ?? this.spec.user ?? 'root' } : request;
    const started = this.agent.start(this.network ? { ...withUser, env: { ...this.network.env, ...request.env } } : withUser);
    if (this.afterFirstCommand !== undefined) {
      const done = () => this.firstCommandDone();
      started.then((process) => process.exited).then(done, done);
    }
    return started;
  }

  connectPort(port: number, options?: ConnectPortOptions): Promise<AgentRelay> {
    if (this.destroying) {
      return Promise.reject(new SandboxError('SANDBOX_NOT_RUNNING', `sandbox ${this.id} is being destroyed`));
    }
    return this.agent.connectPort(port, options);
  }

  async counters(): Promise<SandboxCounters> {
    const counters = await this.cgroup.counters();
    const egress = this.egress?.stats(this.id);
    return egress ? { ...counters, ...egressCounters(egress) } : counters;
  }

  setNetworkPolicy(policy: NetworkPolicy): Promise<void> {
    if (!this.egress || !this.network) {
      if (policy.mode === 'none') return Promise.resolve();
      return Promise.reject(
        new SandboxError('BACKEND_CANNOT_ENFORCE', `sandbox ${this.id} was created without a network and cannot gain one`, {
          details: { sandboxId: this.id, mode: policy.mode },
          hint: 'Create the sandbox with network.mode "allowlist" (an empty allowlist denies everything) to change its policy later.',
        }),
      );
    }
    this.egress.setPolicy(this.id, policy);
    return Promise.resolve();
  }

  memoryUsageBytes(): Promise<number> {
    return this.cgroup.memoryUsageBytes();
  }

  diskUsedBytes(): Promise<number | undefined> {
    return this.diskUsed();
  }

  resetPeak(): Promise<void> {
    return this.cgroup.resetPeak();
  }

  async adopt(spec: SandboxSpec): Promise<void> {
    await this.cgroup.setLimits(spec.limits);
    if (spec.limits.diskBytes !== this.spec.limits.diskBytes) await this.setDiskLimit(spec.limits.diskBytes);
    this.spec = spec;
  }

  freeze(): Promise<void> {
    return this.cgroup.freeze(true);
  }

  thaw(): Promise<void> {
    return this.cgroup.freeze(false);
  }

  /**
   * keepMemory: the cgroup is frozen, memory stays in RAM and is gone with this process.
   * Without memory: every process but the agent ends, the files stay, the agent takes new work.
   */
  async pause(options: PauseOptions): Promise<PauseResult> {
    // Held by a supervisor, a paused sandbox (frozen, or its agent alone) outlives the server
    // like a running one: the next server reattaches it, still paused (NamespaceBackend.reattach).
    const survivesRestart = this.supervised;
    if (options.keepMemory) {
      await this.cgroup.freeze(true);
      return { keepsMemory: true, survivesRestart };
    }
    await killAllButAgent(this.cgroup);
    return { keepsMemory: false, survivesRestart };
  }

  resume(): Promise<void> {
    return this.cgroup.freeze(false);
  }

  destroy(): Promise<void> {
    this.firstCommandDone();
    this.destroying ??= this.teardown();
    return this.destroying;
  }

  /** The processes a reattach took over (running, or ended while no server listened). */
  processes(): readonly AgentProcess[] {
    return this.agent.reattached();
  }

  /** Why it stopped on its own (`agent exited 137`, `supervisor gone`), once `lost` resolved. */
  lostReason(): Promise<string> {
    return this.holder.lostReason();
  }

  /**
   * Lets go of the sandbox, which keeps running under its supervisor for the next server; false
   * (nothing done) when it is not supervised.
   */
  detach(): boolean {
    if (this.destroying || !this.holder.detach()) return false;
    // Its namespace stays with it: only this server's hold on it goes (EgressNetwork.letGo).
    this.egress?.letGo(this.id);
    return true;
  }

  private async teardown(): Promise<void> {
    const failures: string[] = [];
    this.agent.close();
    await this.cgroup.remove().catch((error: Error) => failures.push(error.message));
    this.holder.kill();
    await this.holder.gone;
    await this.release().catch((error: Error) => failures.push(error.message));
    if (failures.length > 0) {
      throw new SandboxError('INTERNAL', `cleanup of sandbox ${this.id} failed: ${failures.join('; ')}`);
    }
  }
}

async function supervisorLog(dataDir: string, id: string): Promise<string> {
  const files = supervisorFiles(dataDir, id);
  const tail = await logTail(files);
  await removeSupervisor(dataDir, id);
  return tail;
}

/** A start that failed, with what the launcher, bwrap or the agent said (a refused mount has its code). */
function startFailure(options: StartOptions, error: unknown, why: string): SandboxError {
  return (
    mountRefusal(why, options.spec) ??
    new SandboxError('HOST_NOT_READY', `sandbox ${options.id} failed to start${why ? `: ${why}` : ''}`, {
      cause: error,
      hint: 'Check that bubblewrap works for unprivileged users on this host (scripts/setup.sh verifies it).',
    })
  );
}

/**
 * Kills every process of a sandbox except its agent and the bwrap processes above it. The group
 * is frozen meanwhile, so nothing forks between the scan and the kill; the agent reaps the dead
 * and reports their exits. The agent is the capsule-agent whose parent is bwrap (it is the
 * namespace's init, under bwrap's monitor): anything a sandbox starts descends from the agent,
 * never from bwrap.
 */
async function killAllButAgent(cgroup: SandboxCgroup): Promise<void> {
  await cgroup.freeze(true);
  try {
    const pids = (await readFile(join(cgroup.dir('unified'), 'cgroup.procs'), 'utf8')).split('\n').filter(Boolean).map(Number);
    const info = new Map<number, { ppid: number; name: string }>();
    for (const pid of pids) {
      const stat = await readFile(`/proc/${pid}/stat`, 'utf8').catch(() => '');
      const match = /^\d+ \((.*)\) \S+ (\d+)/s.exec(stat);
      if (match) info.set(pid, { name: match[1] ?? '', ppid: Number(match[2]) });
    }
    const keep = new Set<number>();
    for (const [pid, { name, ppid }] of info) {
      if (name !== 'capsule-agent' || info.get(ppid)?.name !== 'bwrap') continue;
      for (let cursor: number | undefined = pid; cursor !== undefined && info.has(cursor); cursor = info.get(cursor)?.ppid) keep.add(cursor);
    }
    for (const pid of info.keys()) {
      if (!keep.has(pid)) {
        try {
          process.kill(pid, 'SIGKILL');
        } catch {
          // already gone
        }
      }
    }
  } finally {
    await cgroup.freeze(false);
  }
}
