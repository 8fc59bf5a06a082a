import { spawn, type ChildProcess } from 'node:child_process';
import { mkdir, writeFile } from 'node:fs/promises';
import { privatizeWritten } from '../../host/private-data.host.js';
import { join } from 'node:path';
import { AgentClient, type AgentHandOver, type AgentProcess, type AgentProcessRecord, type AgentRelay } from '../agent/index.js';
import { SandboxError } from '../../errors/index.js';
import type { SandboxCgroup } from '../../host/cgroups.host.js';
import { egressCounters } from '../../host/egress/egress-types.js';
import type { NetworkPolicy, SandboxSpec } from '../../sandbox-spec/index.js';
import type { BackendSandbox, CheckpointResult, ConnectPortOptions, ExecRequest, PauseOptions, PauseResult, SandboxCounters } from '../backend.js';
import type { HostMount } from '../../host/mount-roots.host.js';
import { mountRefusal } from '../host-mounts.js';
import { checkpointImage, readCheckpointState, writeCheckpointState, type GvisorLayout } from './layout.js';
import { gvisorLaunchArgs, type NetworkAttachment, type TemplateLaunch } from './launch-args.js';
import { logTail, removeSupervisor, supervisorFiles } from '../namespace/supervisor.host.js';
import { supervisedHolder, type AgentHolder } from '../namespace/agent-holder.host.js';
import type { Runsc } from './runsc.host.js';

const AGENT_READY_TIMEOUT_MS = 15_000;
const STDERR_TAIL_BYTES = 4096;

export type { NetworkAttachment } from './launch-args.js';

export interface GvisorSandboxOptions {
  id: string;
  spec: SandboxSpec;
  workspaceDir: string;
  cgroup: SandboxCgroup;
  runsc: Runsc;
  layout: GvisorLayout;
  launcher: string;
  network: NetworkAttachment | undefined;
  /** Host mounts, attached by capsule-launch in runsc's private mount namespace at each launch. */
  mounts: readonly HostMount[];
  /** Host directories of `spec.volumes` (resolved for the tenant), attached the same way. */
  volumes: readonly string[];
  /**
   * A sandbox from a template: capsule-launch makes a user namespace with the sandbox's range
   * and attaches `rootDir` through an idmapped mount at the bundle's rootfs, in runsc's private
   * mount namespace, at every launch (run and restore).
   */
  template?: TemplateLaunch;
  /** Capsule's data directory: never mountable (capsule-launch --forbid). */
  dataDir: string;
  diskUsed: () => Promise<number | undefined>;
  release: () => Promise<void>;
  /**
   * runsc is held by a supervisor daemon (capsule-launch --supervise) instead of this process:
   * the sandbox keeps running when the server dies, and a new server reattaches. @default false
   */
  supervise?: boolean;
}

type State = 'starting' | 'running' | 'checkpointing' | 'pausing' | 'paused' | 'resuming' | 'lost' | 'destroyed';

/** One runsc container and the agent inside it, reached over `runsc run`'s (or restore's) stdio. */
export class GvisorSandbox implements BackendSandbox {
  readonly backend = 'gvisor' as const;
  readonly id: string;
  readonly spec: SandboxSpec;
  readonly workspaceDir: string;
  readonly lost: Promise<void>;
  private readonly options: GvisorSandboxOptions;
  private readonly cgroup: SandboxCgroup;
  private state: State = 'starting';
  private child: ChildProcess | undefined;
  private childExited: Promise<void> = Promise.resolve();
  /** The supervisor of the current launch, when supervised (else `child` holds runsc). */
  private holder: AgentHolder | undefined;
  /** Taken over from an earlier server's supervisor: its processes are the LIST's. */
  private isReattached = false;
  private agent: AgentClient | undefined;
  private handOver: AgentHandOver | undefined;
  /** Processes a previous Capsule process left running in the checkpoint (restore after restart). */
  private toAdopt: AgentProcessRecord[] = [];
  private nextProcessId = 1;
  private stderrTail = '';
  private markLost!: () => void;
  private destroying: Promise<void> | undefined;
  /** While a full snapshot's checkpoint stops the sandbox: exec and connectPort wait for it. */
  private checkpointing: Promise<void> | undefined;

  constructor(options: GvisorSandboxOptions) {
    this.options = options;
    this.id = options.id;
    this.spec = options.spec;
    this.workspaceDir = options.workspaceDir;
    this.cgroup = options.cgroup;
    this.lost = new Promise((resolve) => (this.markLost = resolve));
  }

  /** A running sandbox an earlier server started, from its supervisor (GvisorBackend.reattach). */
  static take(options: GvisorSandboxOptions, holder: AgentHolder): GvisorSandbox {
    const sandbox = new GvisorSandbox(options);
    sandbox.holder = holder;
    sandbox.childExited = holder.gone;
    sandbox.isReattached = true;
    sandbox.watch(holder.agent);
    sandbox.agent = holder.agent;
    sandbox.state = 'running';
    return sandbox;
  }

  /** Boots a fresh container: `runsc run`, then the agent's READY. */
  async start(): Promise<void> {
    await this.launch(['run', '--bundle', this.options.layout.bundleDir(this.id), this.id], 'ready');
  }

  /** Takes over a checkpoint a previous process left; the sandbox stays paused until resume(). */
  async adoptCheckpoint(): Promise<void> {
    const saved = await this.options.layout.readPauseState(this.id);
    this.nextProcessId = saved?.nextProcessId ?? 1;
    this.toAdopt = saved?.keepsMemory ? (saved.processes ?? []) : [];
    this.state = 'paused';
  }

  async exec(request: ExecRequest): Promise<AgentProcess> {
    await this.checkpointing;
    if (this.state !== 'running' || this.agent === undefined) {
      throw new SandboxError('SANDBOX_NOT_RUNNING', `sandbox ${this.id} is ${this.state}`, {
        details: { sandboxId: this.id, state: this.state },
        hint: this.state === 'paused' ? 'Resume the sandbox before running processes in it.' : undefined,
      });
    }
    const base = this.options.network?.env;
    // From a template the agent is root; a request that names no user runs as the sandbox's user.
    const withUser = this.options.template ? { ...request, user: request.user ?? this.spec.user ?? 'root' } : request;
    return this.agent.start(base ? { ...withUser, env: { ...base, ...request.env } } : withUser);
  }

  async connectPort(port: number, options?: ConnectPortOptions): Promise<AgentRelay> {
    await this.checkpointing;
    if (this.state !== 'running' || this.agent === undefined) {
      throw new SandboxError('SANDBOX_NOT_RUNNING', `sandbox ${this.id} is ${this.state}`, {
        details: { sandboxId: this.id, state: this.state },
        hint: this.state === 'paused' ? 'Resume the sandbox before connecting to its ports.' : undefined,
      });
    }
    return this.agent.connectPort(port, options);
  }

  /** Running processes the host can talk to, including those a previous Capsule process started. */
  processes(): readonly AgentProcess[] {
    if (this.isReattached) return this.agent?.reattached() ?? [];
    return this.agent?.processes() ?? [];
  }

  /** Why it stopped on its own (`runsc exited 137`, `supervisor gone`), once `lost` resolved. */
  lostReason(): Promise<string> {
    return this.holder?.lostReason() ?? Promise.resolve(`runsc exited ${this.child?.exitCode ?? this.child?.signalCode ?? 'unknown'}`);
  }

  /**
   * Lets go of a running supervised sandbox, which keeps running for the next server; false when
   * it is not supervised or not running (a paused one is a checkpoint on disk already).
   */
  detach(): boolean {
    if (this.state !== 'running' || this.holder === undefined) return false;
    this.state = 'destroyed';
    if (!this.holder.detach()) return false;
    // Its namespace stays with it: only this server's hold on it goes.
    this.options.network?.letGo?.();
    return true;
  }

  async counters(): Promise<SandboxCounters> {
    const counters = await this.cgroup.counters();
    const egress = this.options.network?.stats?.();
    return egress ? { ...counters, ...egressCounters(egress) } : counters;
  }

  /** Delegates to the egress network; a sandbox created without one cannot gain one. */
  setNetworkPolicy(policy: NetworkPolicy): Promise<void> {
    const network = this.options.network;
    if (network?.setPolicy === undefined) {
      if (policy.mode === 'none') return Promise.resolve();
      return Promise.reject(
        new SandboxError('BACKEND_CANNOT_ENFORCE', `sandbox ${this.id} was created without a network and cannot gain one`, {
          details: { sandboxId: this.id, mode: policy.mode },
          hint: 'Create the sandbox with network.mode "allowlist" (an empty allowlist denies everything) to change its policy later.',
        }),
      );
    }
    network.setPolicy(policy);
    return Promise.resolve();
  }

  memoryUsageBytes(): Promise<number> {
    return this.cgroup.memoryUsageBytes();
  }

  diskUsedBytes(): Promise<number | undefined> {
    return this.options.diskUsed();
  }

  resetPeak(): Promise<void> {
    return this.cgroup.resetPeak();
  }

  /**
   * Every runsc process (sentry, gofer, stubs) is in the v2 group: freezing it stops the sandbox.
   * Not in the middle of a checkpoint: the freeze waits for the restored sandbox.
   */
  async freeze(): Promise<void> {
    await this.checkpointing;
    await this.cgroup.freeze(true);
  }

  thaw(): Promise<void> {
    return this.cgroup.freeze(false);
  }

  async pause(options: PauseOptions): Promise<PauseResult> {
    const agent = this.stoppable('paused');
    this.state = 'pausing';
    if (options.keepMemory) {
      await this.save(agent, this.options.layout.imageDir(this.id));
      // No process is left in the group: hand back the page cache it was charged (the image).
      await writeFile(join(this.cgroup.dir('memory'), 'memory.force_empty'), '0').catch(() => undefined);
    } else {
      this.nextProcessId = agent.nextStartId;
      agent.close();
      await this.stopContainer();
    }
    this.agent = undefined;
    await this.options.layout.writePauseState(this.id, {
      keepsMemory: options.keepMemory,
      nextProcessId: this.nextProcessId,
      processes: [...(this.handOver?.records ?? [])],
      pausedAt: new Date().toISOString(),
    });
    this.state = 'paused';
    return { keepsMemory: options.keepMemory, survivesRestart: true };
  }

  /**
   * A full snapshot: saves processes and memory to `dir` (`image/`, and `state.json` naming the
   * agent's processes), calls `whileStopped` while nothing of the sandbox runs (the engine's disk
   * snapshot, so disk and memory are one instant), then restores the sandbox from that image: its
   * processes, and the caller's handles to them, go on. Exec and port connections meanwhile wait.
   * Any number of new sandboxes can start from `dir` (`GvisorSandbox.startFrom`).
   */
  async checkpoint(dir: string, whileStopped: () => Promise<void>): Promise<CheckpointResult> {
    const agent = this.stoppable('checkpointed');
    this.state = 'checkpointing';
    let done!: () => void;
    this.checkpointing = new Promise((resolve) => (done = resolve));
    try {
      const image = checkpointImage(dir);
      await this.save(agent, image);
      const records = [...(this.handOver?.records ?? [])];
      this.agent = undefined;
      let failure: Error | undefined;
      try {
        await writeCheckpointState(dir, { nextProcessId: this.nextProcessId, processes: records, takenAt: new Date().toISOString() });
        await whileStopped();
      } catch (error) {
        failure = error as Error;
      }
      // The sandbox goes on from its image whatever the snapshot's disk step did.
      try {
        await this.launch(['restore', `--image-path=${image}`, '--bundle', this.options.layout.bundleDir(this.id), this.id], 'ping');
      } catch (error) {
        this.state = 'lost';
        this.markLost();
        throw error;
      }
      this.handOver = undefined;
      if (failure !== undefined) throw failure;
      return { processIds: records.map((r) => r.id) };
    } finally {
      if (this.state === 'checkpointing') this.state = 'running';
      this.checkpointing = undefined;
      done();
    }
  }

  /**
   * Starts a new sandbox from a full snapshot's checkpoint (`checkpoint(dir)` of another
   * sandbox): runsc restores its processes and memory in this sandbox's own bundle (its own id,
   * cgroups and disk, mounts at the same paths), and `processes()` has handles to them.
   */
  async startFrom(dir: string): Promise<void> {
    const saved = await readCheckpointState(dir);
    if (saved === undefined) {
      throw new SandboxError('SNAPSHOT_NOT_FOUND', `the checkpoint at ${dir} is missing`, {
        hint: 'The full snapshot\'s data is gone; take a new snapshot of the source sandbox.',
      });
    }
    this.nextProcessId = saved.nextProcessId;
    this.toAdopt = saved.processes;
    await this.launch(['restore', `--image-path=${checkpointImage(dir)}`, '--bundle', this.options.layout.bundleDir(this.id), this.id], 'ping');
    this.toAdopt = [];
  }

  /** The agent of a running sandbox that may be stopped (pause, checkpoint), or why not. */
  private stoppable(what: 'paused' | 'checkpointed'): AgentClient {
    if (this.state !== 'running') {
      throw new SandboxError('CONFLICT', `sandbox ${this.id} is ${this.state}; only a running sandbox can be ${what}`, {
        details: { sandboxId: this.id, state: this.state },
      });
    }
    if (this.options.network) {
      // runsc's netstack takes the namespace's address, routes and neighbours off eth0 when it
      // starts: a second `runsc run` or a restore there has no network. Refused, never degraded.
      const verb = what === 'paused' ? 'pausing' : 'a full snapshot of';
      throw new SandboxError('UNIMPLEMENTED', `sandbox ${this.id} has a network; ${verb} a gVisor sandbox with a network is not supported yet`, {
        details: { sandboxId: this.id, backend: 'gvisor', mode: this.spec.network.mode },
        hint: what === 'paused'
          ? 'Pause gVisor sandboxes created with network mode "none", or use the namespace backend for a networked sandbox you need to pause.'
          : 'Take a filesystem snapshot (mode "filesystem"), or create the sandbox with network mode "none" to keep its processes in a snapshot.',
      });
    }
    if (this.agent === undefined) throw new SandboxError('INTERNAL', `sandbox ${this.id} has no agent`);
    return this.agent;
  }

  /**
   * `runsc checkpoint` into `image`: the container stops, the agent lives on inside the image.
   * Its stream ends here, its processes do not: their handles wait in `handOver` for the next
   * launch (a restore), which rebinds them.
   */
  private async save(agent: AgentClient, image: string): Promise<void> {
    agent.prepareHandOver();
    try {
      await mkdir(image, { recursive: true, mode: 0o700 });
      await this.options.runsc.checkpoint(this.id, image);
      // runsc writes the image (another tenant's memory, to any reader) 0644: root's alone.
      await privatizeWritten(image);
    } catch (error) {
      agent.prepareHandOver(false);
      this.state = 'running';
      throw new SandboxError('INTERNAL', `checkpoint of sandbox ${this.id} failed: ${(error as Error).message}`, { cause: error });
    }
    await this.childExited; // runsc run (and its supervisor) ends once the container is saved
    // runsc run may leave the saved container behind as "stopped"; restore needs the id free.
    await this.options.runsc.deleteForce(this.id);
    this.handOver = agent.handOver();
    this.nextProcessId = this.handOver.nextProcessId;
  }

  async resume(): Promise<void> {
    if (this.state !== 'paused') {
      throw new SandboxError('CONFLICT', `sandbox ${this.id} is ${this.state}; only a paused sandbox can be resumed`, {
        details: { sandboxId: this.id, state: this.state },
      });
    }
    const saved = await this.options.layout.readPauseState(this.id);
    this.state = 'resuming';
    const bundle = this.options.layout.bundleDir(this.id);
    try {
      if (saved?.keepsMemory) {
        const image = this.options.layout.imageDir(this.id);
        await this.launch(['restore', `--image-path=${image}`, '--bundle', bundle, this.id], 'ping');
      } else {
        await this.launch(['run', '--bundle', bundle, this.id], 'ready');
      }
    } catch (error) {
      this.state = 'paused';
      throw error;
    }
    this.handOver = undefined;
    this.toAdopt = [];
    await this.options.layout.removeCheckpoint(this.id);
  }

  destroy(): Promise<void> {
    this.destroying ??= this.teardown();
    return this.destroying;
  }

  /**
   * Starts runsc through capsule-launch, which puts it (and so the sentry, gofer and stubs) in
   * the sandbox's v2 cgroup for freeze and kill, and stays as their subreaper. runsc moves the
   * sentry and gofer into the v1 groups named by cgroupsPath, where the limits are.
   */
  private async launch(runscArgs: string[], waitFor: 'ready' | 'ping'): Promise<void> {
    const { network, layout, template } = this.options;
    const args = gvisorLaunchArgs({
      spec: this.spec, cgroup2Dir: this.cgroup.dir('unified'), dataDir: this.options.dataDir, mounts: this.options.mounts, volumes: this.options.volumes,
      mountSource: (index) => layout.mountSource(this.id, index), volumeSource: (index) => layout.volumeSource(this.id, index),
      template, network,
      runsc: [this.options.runsc.binary, ...this.options.runsc.flagsFor(network ? 'sandbox' : 'none'), ...runscArgs],
    });
    this.stderrTail = '';
    const clientOptions = this.handOver ? { handOver: this.handOver } : { firstProcessId: this.nextProcessId, adopt: this.toAdopt };
    let agent: AgentClient;
    let spawnError: Promise<never> = new Promise<never>(() => undefined);
    if (this.options.supervise) {
      try {
        this.holder = await supervisedHolder(this.options.launcher, args, this.options.dataDir, this.id, 'runsc', clientOptions);
      } catch (error) {
        throw this.startFailure(error, await supervisorLog(this.options.dataDir, this.id));
      }
      this.childExited = this.holder.gone;
      agent = this.holder.agent;
    } else {
      const child = spawn(this.options.launcher, args, { stdio: ['pipe', 'pipe', 'pipe'], env: {} });
      this.child = child;
      this.childExited = new Promise((resolve) => child.once('close', () => resolve()));
      child.stderr?.on('data', (chunk: Buffer) => {
        this.stderrTail = (this.stderrTail + chunk.toString('utf8')).slice(-STDERR_TAIL_BYTES);
      });
      agent = new AgentClient(child.stdin, child.stdout, clientOptions);
      spawnError = new Promise<never>((_, reject) => child.once('error', reject));
    }
    this.watch(agent);
    const exitedEarly = this.childExited.then(() => {
      throw new Error('runsc exited before the agent answered');
    });
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`no answer within ${AGENT_READY_TIMEOUT_MS} ms`)), AGENT_READY_TIMEOUT_MS);
    });
    try {
      await Promise.race([waitFor === 'ready' ? agent.ready : agent.ping(AGENT_READY_TIMEOUT_MS), spawnError, exitedEarly, timeout]);
    } catch (error) {
      const why = this.holder ? await this.holder.stderrTail() : this.stderrTail.trim();
      agent.close();
      await this.stopContainer();
      throw this.startFailure(error, why);
    } finally {
      clearTimeout(timer);
      exitedEarly.catch(() => undefined);
    }
    this.agent = agent;
    this.state = 'running';
  }

  /** The agent of the current launch: a stream that ends while the sandbox runs is its loss. */
  private watch(agent: AgentClient): void {
    agent.onLost(() => {
      if (this.agent === agent && this.state === 'running') this.markLost();
    });
  }

  /** A launch that failed, with what the launcher or runsc said (a refused mount has its code). */
  private startFailure(error: unknown, why: string): SandboxError {
    return (
      mountRefusal(why, this.spec) ??
      new SandboxError('HOST_NOT_READY', `gVisor sandbox ${this.id} failed to start${why ? `: ${why}` : ''}`, {
        cause: error,
        hint: 'Check that runsc works on this host (scripts/setup.sh installs it); set debugLogDir on the gvisor backend for runsc logs.',
      })
    );
  }

  /** Kills every runsc process of this sandbox and removes runsc's record of the container. */
  private async stopContainer(): Promise<void> {
    await this.cgroup.kill();
    const child = this.child;
    if (child && child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    this.holder?.kill();
    await this.childExited;
    await this.options.runsc.deleteForce(this.id);
  }

  private async teardown(): Promise<void> {
    const failures: string[] = [];
    const wasRunning = this.state === 'running';
    this.state = 'destroyed';
    this.agent?.close();
    if (wasRunning) this.markLost();
    await this.stopContainer().catch((error: Error) => failures.push(error.message));
    await this.cgroup.remove().catch((error: Error) => failures.push(error.message));
    await this.options.release().catch((error: Error) => failures.push(error.message));
    if (failures.length > 0) {
      throw new SandboxError('INTERNAL', `cleanup of sandbox ${this.id} failed: ${failures.join('; ')}`);
    }
  }
}

/** What a supervisor that did not start said, and its files gone. */
async function supervisorLog(dataDir: string, id: string): Promise<string> {
  const tail = await logTail(supervisorFiles(dataDir, id));
  await removeSupervisor(dataDir, id);
  return tail;
}
