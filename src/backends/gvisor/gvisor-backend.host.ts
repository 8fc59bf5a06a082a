import { createHash } from 'node:crypto';
import { mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { SandboxError } from '../../errors/index.js';
import { SandboxCgroup, listSandboxCgroups } from '../../host/cgroups.host.js';
import type { HostEnvironment, HostPaths } from '../../host/host-env.host.js';
import type { SandboxSpec } from '../../sandbox-spec/index.js';
import type { Backend, BackendProbe, BackendSandbox, Capability, CreateOptions, ReattachOptions, ReconcileReport } from '../backend.js';
import { reattachHolder } from '../namespace/agent-holder.host.js';
import { supervisorState, unansweredSupervisor } from '../namespace/supervisor.host.js';
import type { HostMount } from '../../host/mount-roots.host.js';
import { hostMountsOf } from '../host-mounts.js';
import { volumesOf } from '../volumes.js';
import { lendVolume, returnVolume } from '../../host/stored-disks.host.js';
import { buildOciSpec, hostPidsBackstop, type OciSpec } from './oci-bundle.js';
import { GvisorLayout } from './layout.js';
import { GvisorSandbox, type NetworkAttachment } from './gvisor-sandbox.host.js';
import { makeMountPoint, probeRunsc, Runsc, writeRootfs, type RunscInfo } from './runsc.host.js';
import { RANGE_SIZE } from '../../host/uid-ranges.js';

/** Host uids of gVisor sandbox users; apart from the namespace backend's 3,000,000 range. */
const UID_BASE = 4_000_000;
const UID_RANGE = 1_000_000;

const CAPABILITIES: readonly Capability[] = [
  'limits.cpus', 'limits.memory', 'limits.pids', 'limits.disk', 'limits.fileSize',
  'limits.openFiles', 'limits.tmp', 'mounts.readOnly', 'network.none', 'pause.freeze', 'pause.keepMemoryOnDisk', 'volumes',
];

/**
 * The seam for sandbox networking: a per-sandbox network namespace made by the host's network
 * code (veth, nftables, egress proxy). runsc runs inside it with `--network=sandbox`, so gVisor's
 * own netstack sees only what that namespace offers.
 */
export interface NetworkNamespaceProvider {
  /** What sandboxes get through it, e.g. 'network.allowlist'. */
  readonly capabilities: readonly Capability[];
  acquire(id: string, spec: SandboxSpec, tenantId?: string): Promise<NetworkAttachment>;
  /** The namespace a sandbox kept while no server ran, its policy registered again (see EgressNetwork.reattach). */
  reattach?(id: string, spec: SandboxSpec, tenantId?: string): Promise<NetworkAttachment>;
}

export interface GvisorBackendOptions {
  host: HostEnvironment;
  /** Write runsc's own debug logs here (one set per runsc command). Only for debugging. */
  debugLogDir?: string;
  /** Per-sandbox network namespaces; without it only `network.mode: 'none'` is offered. */
  network?: NetworkNamespaceProvider;
  /**
   * Each sandbox's runsc is held by a supervisor daemon (capsule-launch --supervise) instead of
   * this process: it keeps running when the server dies, and a new server reattaches to it
   * (`reattach`). @default false (sandboxes die with the server)
   */
  supervise?: boolean;
}

/**
 * gVisor: each sandbox is a runsc container whose init is the same capsule-agent the namespace
 * backend uses, spoken to over runsc's stdio pipes. Syscalls go to gVisor's user-space kernel
 * (systrap platform), never straight to the host's. See docs/decisions/004-gvisor.md.
 */
export class GvisorBackend implements Backend {
  readonly name = 'gvisor' as const;
  private readonly host: HostEnvironment;
  private readonly layout: GvisorLayout;
  private readonly options: GvisorBackendOptions;
  private readonly uidsInUse = new Set<number>();
  private runsc: Promise<{ info: RunscInfo; runsc: Runsc }> | undefined;

  constructor(options: GvisorBackendOptions) {
    this.host = options.host;
    this.options = options;
    this.layout = new GvisorLayout(options.host.dataDir);
  }

  async probe(): Promise<BackendProbe> {
    try {
      await this.host.ensure();
      await this.ready();
      return { available: true, capabilities: [...CAPABILITIES, ...(this.options.network?.capabilities ?? [])] };
    } catch (error) {
      return { available: false, reason: (error as Error).message, capabilities: [] };
    }
  }

  async create(spec: SandboxSpec, options: CreateOptions): Promise<BackendSandbox> {
    return this.open(spec, options.id, {
      mode: 'run', reuseWorkspace: options.reuseWorkspace === true, signal: options.signal, mounts: options.mounts, volumes: options.volumes,
      template: options.template, workspaceFrom: options.workspaceFrom, tenantId: options.tenantId, restoreFrom: options.restoreFrom,
    });
  }

  /** A sandbox a previous Capsule process paused to a checkpoint, still paused: resume() restores it. */
  async restore(id: string, spec: SandboxSpec, options: { mounts?: readonly HostMount[]; volumes?: readonly string[] } = {}): Promise<BackendSandbox> {
    const saved = await this.layout.readPauseState(id);
    if (saved === undefined) {
      throw new SandboxError('SANDBOX_NOT_FOUND', `sandbox ${id} has no gVisor checkpoint to restore`, {
        details: { sandboxId: id },
        hint: 'Only a sandbox paused with keepMemory on the gvisor backend can be restored after a restart.',
      });
    }
    return this.open(spec, id, { mode: 'paused', reuseWorkspace: true, mounts: options.mounts, volumes: options.volumes });
  }

  /**
   * Takes over a running sandbox whose supervisor outlived the previous server: the same runsc
   * container, cgroup, root, network namespace (policy registered again) and processes.
   * Undefined when it never had a supervisor; SANDBOX_CRASHED with the reason when its
   * supervisor is gone (`runsc exited N while no server was attached`); another error when the
   * host fails to take it over (the engine then recovers it on its files).
   */
  async reattach(id: string, spec: SandboxSpec, options: ReattachOptions = {}): Promise<BackendSandbox | undefined> {
    const paths = await this.host.ensure();
    const held = await supervisorState(paths.dataDir, id, 'runsc');
    if (held.state === 'none') return undefined;
    if (held.state === 'ended') throw new SandboxError('SANDBOX_CRASHED', held.reason, { details: { sandboxId: id } });
    const { runsc } = await this.ready();
    const network = spec.network.mode === 'none' ? undefined : await this.options.network?.reattach?.(id, spec, options.tenantId);
    if (spec.network.mode !== 'none' && network === undefined) {
      throw new SandboxError('HOST_NOT_READY', `its network cannot be taken over: this server has no network for gVisor sandboxes`, { details: { sandboxId: id } });
    }
    const holder = await reattachHolder(paths.dataDir, id, 'runsc').catch(() => undefined);
    if (holder === undefined) {
      await network?.release().catch(() => undefined);
      throw await unansweredSupervisor(paths.dataDir, id, 'runsc');
    }
    const volume = this.host.volume;
    const fromTemplate = await volume.isRoot(id);
    let uid: number;
    try {
      uid = await this.reclaimUid(id, fromTemplate);
    } catch (error) {
      await network?.release().catch(() => undefined);
      holder.detach();
      throw error;
    }
    // The volumes stay attached inside runsc's mount namespace; writable ones lent to a host
    // template's uid are given back when the sandbox ends, as after a create.
    const volumes = volumesOf(spec, options.volumes);
    const lent = fromTemplate ? [] : volumes.filter((_, index) => spec.volumes[index]?.readOnly !== true);
    return GvisorSandbox.take(
      {
        id, spec, workspaceDir: fromTemplate ? join(volume.rootPath(id), 'workspace') : volume.path(id),
        cgroup: SandboxCgroup.attach(`${this.host.cgroupPrefix}${id}`), runsc, layout: this.layout, launcher: paths.launcher, network,
        mounts: hostMountsOf(spec, options.mounts), volumes, dataDir: paths.dataDir, supervise: true,
        ...(fromTemplate ? { template: { rootDir: volume.rootPath(id), hostBase: uid, size: RANGE_SIZE, toolsDir: paths.toolsDir } } : {}),
        diskUsed: () => volume.usedBytes(id),
        release: async () => {
          if (fromTemplate) this.host.uidRanges.release(id);
          else this.uidsInUse.delete(uid);
          await network?.release();
          for (const dir of lent) await returnVolume(dir);
          await this.layout.removeCheckpoint(id);
          await this.layout.removeBundle(id);
          await volume.delete(id);
        },
      },
      holder,
    );
  }

  async reconcile(liveIds: ReadonlySet<string>, reattached: ReadonlySet<string> = new Set()): Promise<ReconcileReport> {
    await this.host.ensure();
    // Without runsc on this host no container of ours can exist; the files can still go.
    const runsc = await this.ready().then((r) => r.runsc, () => undefined);
    const removed: string[] = [];
    const failures: string[] = [];
    const attempt = async (what: string, step: () => Promise<void>): Promise<void> => {
      try {
        await step();
        removed.push(what);
      } catch (error) {
        failures.push(`${what}: ${(error as Error).message}`);
      }
    };
    // A container of a previous process that nobody reattached to: nobody can talk to its agent.
    // Its supervisor (if it had one) goes with the namespace backend's reconcile of run/.
    for (const id of (await runsc?.list()) ?? []) {
      if (!reattached.has(id)) await attempt(`runsc:${id}`, () => runsc!.deleteForce(id));
    }
    for (const name of await listSandboxCgroups(this.host.cgroupPrefix)) {
      // Both backends share the cgroup prefix: a sandbox another backend took over is not ours to remove.
      if (reattached.has(name.slice(this.host.cgroupPrefix.length))) continue;
      await attempt(`cgroup:${name.slice(this.host.cgroupPrefix.length)}`, () => SandboxCgroup.attach(name).remove());
    }
    for (const id of await this.layout.listBundles()) {
      if (!liveIds.has(id)) await attempt(`bundle:${id}`, () => this.layout.removeBundle(id));
    }
    for (const id of await this.layout.listCheckpoints()) {
      if (!liveIds.has(id)) await attempt(`checkpoint:${id}`, () => this.layout.removeCheckpoint(id));
    }
    for (const id of await this.host.volume.list()) {
      if (!liveIds.has(id)) await attempt(`workspace:${id}`, () => this.host.volume.delete(id));
    }
    return { removed, failures };
  }

  private ready(): Promise<{ info: RunscInfo; runsc: Runsc }> {
    this.runsc ??= probeRunsc().then((info) => ({
      info,
      runsc: new Runsc(info.binary, { rootDir: this.layout.runscRoot, platform: info.platform, debugLogDir: this.options.debugLogDir }),
    }));
    this.runsc.catch(() => (this.runsc = undefined));
    return this.runsc;
  }

  private async open(
    spec: SandboxSpec,
    id: string,
    how: {
      mode: 'run' | 'paused'; reuseWorkspace: boolean; signal?: AbortSignal; mounts?: readonly HostMount[]; volumes?: readonly string[] | undefined;
      template?: { layerDir: string } | undefined; workspaceFrom?: string | undefined; tenantId?: string | undefined; restoreFrom?: string | undefined;
    },
  ): Promise<BackendSandbox> {
    const mounts = hostMountsOf(spec, how.mounts);
    const volumes = volumesOf(spec, how.volumes);
    const paths = await this.host.ensure();
    const { runsc } = await this.ready();
    if (spec.network.mode !== 'none' && !this.options.network?.capabilities.includes(`network.${spec.network.mode}`)) {
      throw new SandboxError('BACKEND_CANNOT_ENFORCE', `backend gvisor cannot enforce network.${spec.network.mode} on this host`, {
        details: { backend: 'gvisor', missing: [`network.${spec.network.mode}`] },
        hint: 'Use network mode "none" with the gvisor backend until per-sandbox network namespaces are configured for it.',
      });
    }
    if (how.mode === 'paused') {
      // Left by the process that paused it, or by a crash: nothing of it is running now.
      await runsc.deleteForce(id);
      await SandboxCgroup.attach(`${this.host.cgroupPrefix}${id}`).remove();
    }
    // A sandbox from a template (or recovered onto its root): its own root, a range of host uids.
    const volume = this.host.volume;
    const fromTemplate = how.template !== undefined || (how.reuseWorkspace && (await volume.isRoot(id)));
    const uid = fromTemplate ? this.host.uidRanges.allocate(id) : this.allocateUid(id);
    const releaseUid = () => (fromTemplate ? this.host.uidRanges.release(id) : void this.uidsInUse.delete(uid));
    const cleanup: (() => Promise<unknown>)[] = [() => Promise.resolve(releaseUid())];
    try {
      const cgroupName = `${this.host.cgroupPrefix}${id}`;
      const limits = { ...spec.limits, pids: hostPidsBackstop(spec.limits.pids) };
      // Independent steps run at once (the bundle only waits for the network's resolver); each
      // that finished is undone if another failed. runsc joins the pre-made cgroups and leaves
      // them when the container goes: the counters (OOM kills above all) stay readable after
      // the sandbox died of its memory limit.
      const networkMade = spec.network.mode === 'none' ? Promise.resolve(undefined) : this.options.network?.acquire(id, spec, how.tenantId);
      const workspaceMade = how.reuseWorkspace
        ? volume.adopt(id, spec.limits.diskBytes, uid)
        : how.template
          ? volume.createRoot(id, how.template.layerDir).then((made) => made.workspace)
          : how.workspaceFrom !== undefined
            ? volume.createWorkspaceFrom(id, how.workspaceFrom, uid)
            : volume.createWithoutLimit(id, uid);
      const [madeRunscRoot, madeCgroup, madeWorkspace, madeNetwork, wroteBundle] = await Promise.allSettled([
        mkdir(this.layout.runscRoot, { recursive: true, mode: 0o700 }),
        SandboxCgroup.create(this.host.cgroupPrefix, id, limits),
        // A fresh workspace gets its quota while runsc boots (below), before create() returns; a
        // restored one at once: its processes write as soon as runsc restores them.
        how.restoreFrom !== undefined ? workspaceMade.then(async (dir) => (await volume.setLimit(id, spec.limits.diskBytes), dir)) : workspaceMade,
        networkMade,
        Promise.resolve(networkMade).then((network) =>
          this.writeBundle(id, spec, { hostUid: uid, cgroupsPath: cgroupName, workspaceDir: volume.path(id), network, paths, mounts, fromTemplate }),
        ),
      ]);
      if (madeCgroup.status === 'fulfilled') cleanup.push(() => madeCgroup.value.remove());
      if (madeWorkspace.status === 'fulfilled' && !how.reuseWorkspace) cleanup.push(() => this.host.volume.delete(id));
      if (madeNetwork.status === 'fulfilled' && madeNetwork.value) cleanup.push(() => madeNetwork.value!.release());
      cleanup.push(() => this.layout.removeBundle(id));
      for (const step of [madeRunscRoot, madeCgroup, madeWorkspace, madeNetwork, wroteBundle]) if (step.status === 'rejected') throw step.reason;
      // The host template's sandbox has one uid: its writable volumes are lent to it until it ends.
      const lent = fromTemplate ? [] : volumes.filter((_, index) => spec.volumes[index]?.readOnly !== true);
      for (const dir of lent) {
        cleanup.push(() => returnVolume(dir));
        await lendVolume(dir, uid);
      }
      const cgroup = (madeCgroup as PromiseFulfilledResult<SandboxCgroup>).value;
      const workspaceDir = (madeWorkspace as PromiseFulfilledResult<string>).value;
      const network = (madeNetwork as PromiseFulfilledResult<NetworkAttachment | undefined>).value;
      how.signal?.throwIfAborted();
      const sandbox = new GvisorSandbox({
        id, spec, workspaceDir, cgroup, runsc, layout: this.layout, launcher: paths.launcher, network, mounts, volumes, dataDir: paths.dataDir,
        supervise: this.options.supervise === true,
        ...(fromTemplate ? { template: { rootDir: volume.rootPath(id), hostBase: uid, size: RANGE_SIZE, toolsDir: paths.toolsDir } } : {}),
        diskUsed: () => this.host.volume.usedBytes(id),
        release: async () => {
          releaseUid();
          await network?.release();
          for (const dir of lent) await returnVolume(dir);
          await this.layout.removeCheckpoint(id);
          await this.layout.removeBundle(id);
          await this.host.volume.delete(id);
        },
      });
      if (how.mode === 'paused') {
        await sandbox.adoptCheckpoint();
        return sandbox;
      }
      if (how.restoreFrom !== undefined) {
        await sandbox.startFrom(how.restoreFrom);
        return sandbox;
      }
      // Nothing runs in a fresh sandbox before create() returns (the agent only waits for
      // requests), so the quota is set while runsc boots instead of before: one btrfs spawn off the path.
      const starting = sandbox.start().then(() => sandbox);
      return await (how.reuseWorkspace ? starting : this.host.volume.limitWhile(id, spec.limits.diskBytes, starting));
    } catch (error) {
      for (const step of cleanup.reverse()) await step().catch(() => undefined);
      if (how.signal?.aborted) throw new SandboxError('ABORTED', `creating sandbox ${id} was aborted`, { cause: error });
      throw error;
    }
  }

  /** The bundle runsc reads: the OCI spec and the read-only root skeleton of its mount points. */
  private async writeBundle(
    id: string,
    spec: SandboxSpec,
    options: {
      hostUid: number; cgroupsPath: string; workspaceDir: string; network: NetworkAttachment | undefined; paths: HostPaths;
      mounts: readonly HostMount[]; fromTemplate: boolean;
    },
  ): Promise<void> {
    const { network, paths, mounts } = options;
    const bundleDir = this.layout.bundleDir(id);
    const oci: OciSpec = buildOciSpec(spec, {
      rootfsDir: join(bundleDir, 'rootfs'),
      workspaceDir: options.workspaceDir,
      etcDir: paths.sandboxEtcDir,
      toolsDir: paths.toolsDir,
      hostUid: options.hostUid,
      cgroupsPath: options.cgroupsPath,
      ...(network?.resolvConf !== undefined ? { resolvConf: network.resolvConf } : {}),
      ...(network ? { netnsPath: network.path } : {}),
      mountSources: mounts.map((m) => this.layout.mountSource(id, m.index)),
      volumeSources: spec.volumes.map((_, index) => this.layout.volumeSource(id, index)),
      ...(options.fromTemplate ? { template: { hostBase: options.hostUid, size: RANGE_SIZE } } : {}),
    });
    await rm(bundleDir, { recursive: true, force: true });
    await mkdir(bundleDir, { recursive: true, mode: 0o700 });
    // A template's root and mounts are staged by capsule-launch; the host template's root is a
    // skeleton of mount points in the bundle.
    if (!options.fromTemplate) {
      const points = [...mounts.map((m) => ({ path: m.sandboxPath, kind: m.kind })), ...spec.volumes.map((v) => ({ path: v.path, kind: 'dir' as const }))];
      await writeRootfs(oci.root.path, points);
      for (const m of mounts) await makeMountPoint(this.layout.mountSource(id, m.index), m.kind, 0o700);
      for (let index = 0; index < spec.volumes.length; index++) await makeMountPoint(this.layout.volumeSource(id, index), 'dir', 0o700);
    }
    await writeFile(join(bundleDir, 'config.json'), JSON.stringify(oci, null, 1), { mode: 0o600 });
  }

  /**
   * The host uid (or a template sandbox's range) a running sandbox taken over has: the one its
   * bundle maps the sandbox's user to, not one derived again from its id (which can differ after
   * a collision, and would let this server hand the uid in use to another sandbox). HOST_NOT_READY
   * (the engine recovers it on its files) when another sandbox of this server holds it.
   */
  private async reclaimUid(id: string, fromTemplate: boolean): Promise<number> {
    const bundled = await readFile(join(this.layout.bundleDir(id), 'config.json'), 'utf8')
      .then((text) => JSON.parse(text) as OciSpec)
      .then((oci) => oci.linux.uidMappings.map((m) => m.hostID).filter((hostId) => hostId !== 0))
      .catch(() => [] as number[]);
    if (bundled.length === 0) return fromTemplate ? this.host.uidRanges.allocate(id) : this.allocateUid(id);
    const running = Math.min(...bundled);
    const free = !fromTemplate && running >= UID_BASE && running < UID_BASE + UID_RANGE && !this.uidsInUse.has(running);
    if (fromTemplate ? !this.host.uidRanges.claim(id, running) : !free) {
      throw new SandboxError('HOST_NOT_READY', `its processes run as host uid ${running}, which another sandbox of this server holds`, { details: { sandboxId: id, uid: running } });
    }
    if (!fromTemplate) this.uidsInUse.add(running);
    return running;
  }

  /** Derived from the id; a sandbox recovered on its files gets them chowned to its uid. */
  private allocateUid(id: string): number {
    let uid = UID_BASE + (createHash('sha256').update(`gvisor:${id}`).digest().readUInt32BE(0) % UID_RANGE);
    while (this.uidsInUse.has(uid)) uid = UID_BASE + ((uid - UID_BASE + 1) % UID_RANGE);
    this.uidsInUse.add(uid);
    return uid;
  }
}

