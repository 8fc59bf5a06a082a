import { mkdir, readdir, rm, writeFile } from 'node:fs/promises';
import { readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { createHash } from 'node:crypto';
import { join, resolve } from 'node:path';
import type { NetworkPolicy } from '../sandbox-spec/index.js';
import { isSandboxError, SandboxError } from '../errors/index.js';
import type { HostEnvironment } from './host-env.host.js';
import { CredentialBroker } from './egress/broker.js';
import { DEFAULT_EGRESS_PORTS, EgressProxy, type EgressPorts, type EgressStats } from './egress/egress-proxy.js';
import type { EgressLogEntry } from './egress/denial-log.js';
import { descriptorBudget, parseOpenFilesLimit, type EgressTimeouts } from './egress/connection-limits.js';
import { DEFAULT_MAXIMA } from '../sandbox-spec/index.js';
import { applyRuleset, deleteTable, hostRuleset, kernelConnectionCap, listTables, sandboxRuleset } from './nftables.host.js';
import {
  destroyNetns, ensureAnchor, listInstanceNetns, NetnsPool, NetworkNames, removeAnchor, slotOwner, slotRecord, type NetnsSlot,
} from './netns-pool.host.js';
import { networkPrerequisitesProblem } from './network-prerequisites.host.js';

export { networkPrerequisitesProblem } from './network-prerequisites.host.js';

export interface EgressNetworkOptions {
  host: HostEnvironment;
  /** The instance's /24 for the proxy (.1) and sandboxes (.2-.254). @default 10.<200-249>.<x>.0/24 from the data dir */
  subnet?: string;
  /** Namespaces kept ready. @default 2 */
  poolSize?: number;
  /** Operator deny list: overrides every sandbox's allowlist. */
  operatorDeny?: readonly string[];
  /** Operator name → addresses override, consulted before the system resolver. */
  hosts?: Readonly<Record<string, readonly string[]>>;
  /** Resolve only names in `hosts` (tests: no query leaves the machine). @default false */
  hostsOnly?: boolean;
  /** Where denied attempts are logged (repeats summed; see EgressProxyOptions.log). @default a JSON line on stderr */
  log?: (entry: EgressLogEntry) => void;
  /** @default a broker over `<dataDir>/broker` */
  broker?: CredentialBroker;
  ports?: Partial<EgressPorts>;
  /** Handshake and idle timeouts of proxy connections (`capsule serve --egress-idle-timeout`). */
  timeouts?: Partial<EgressTimeouts>;
  /**
   * The operator's maximum of `network.maxConcurrentConnections`: the host's nftables refuse a
   * sandbox's connections to the proxy a margin past it. @default DEFAULT_MAXIMA.network
   */
  maxConcurrentConnections?: number;
  /**
   * Descriptors kept for the rest of the server: the proxy holds at most RLIMIT_NOFILE minus
   * this across all sandboxes. @default a quarter of the limit, at least 1024
   */
  descriptorReserve?: number;
}

/** What a sandbox's launch needs to use its network. */
export interface NetworkAttachment {
  /** The namespace file for capsule-launch `--netns`. */
  netnsPath: string;
  /** The sandbox's address on its veth. */
  address: string;
  /** resolv.conf to bind at /etc/resolv.conf (the proxy's resolver). */
  resolvConf: string;
  /** HTTP(S)_PROXY and NO_PROXY for every process. */
  env: Record<string, string>;
}

/**
 * Networking for sandboxes of one Capsule instance: the anchor address, the host nftables table,
 * the egress proxy (with resolver and broker) and the namespace pool. Started on first use; a
 * sandbox attaches a namespace and registers its policy with the proxy; close() removes it all.
 */
export class EgressNetwork {
  readonly names: NetworkNames;
  readonly proxyAddress: string;
  readonly subnet: string;
  readonly proxy: EgressProxy;
  readonly broker: CredentialBroker;
  private readonly options: EgressNetworkOptions;
  private readonly stateDir: string;
  private readonly pool: NetnsPool;
  private readonly slots = new Map<string, NetnsSlot>();
  /** Sandboxes let go (`letGo`) that keep running without this server: their host state stays. */
  private readonly leftRunning = new Set<string>();
  private starting: Promise<void> | undefined;
  private readonly maxConcurrentConnections: number;

  constructor(options: EgressNetworkOptions) {
    this.options = options;
    this.names = new NetworkNames(options.host.cgroupPrefix);
    this.subnet = options.subnet ?? defaultSubnet(options.host.dataDir);
    const base = /^(\d+\.\d+\.\d+)\.0\/24$/.exec(this.subnet)?.[1];
    if (!base) throw new Error(`subnet must be an IPv4 /24 (a.b.c.0/24), got ${this.subnet}`);
    this.proxyAddress = `${base}.1`;
    this.stateDir = join(options.host.dataDir, 'net', 'slots');
    this.broker = options.broker ?? new CredentialBroker({ dir: join(options.host.dataDir, 'broker') });
    const ports = { ...DEFAULT_EGRESS_PORTS, ...options.ports };
    this.maxConcurrentConnections = options.maxConcurrentConnections ?? DEFAULT_MAXIMA.network?.maxConcurrentConnections ?? 1024;
    const openFiles = openFilesLimit();
    this.proxy = new EgressProxy({
      address: this.proxyAddress,
      ports,
      operatorDeny: options.operatorDeny,
      hosts: options.hosts,
      hostsOnly: options.hostsOnly,
      broker: this.broker,
      log: options.log,
      timeouts: options.timeouts,
      ...(openFiles === undefined ? {} : { maxDescriptors: descriptorBudget(openFiles, options.descriptorReserve) }),
      // Beside the slot's owner: a server that reattaches after a crash counts on from there.
      recordConnections: (sandboxId, upTo) => this.recordConnections(sandboxId, upTo),
    });
    this.pool = new NetnsPool({
      names: this.names,
      subnetBase: base,
      proxyAddress: this.proxyAddress,
      ruleset: sandboxRuleset(this.proxyAddress, ports),
      stateDir: this.stateDir,
      size: options.poolSize,
    });
  }

  get resolvConf(): string {
    return join(this.options.host.dataDir, 'net', 'resolv.conf');
  }

  get isStarted(): boolean {
    return this.starting !== undefined;
  }

  /** Anchor, host rules, proxy, pool. Idempotent; concurrent callers share one start. */
  start(): Promise<void> {
    this.starting ??= this.doStart().catch((error: unknown) => {
      this.starting = undefined;
      if (isSandboxError(error)) throw error;
      const busy = (error as NodeJS.ErrnoException).code === 'EADDRINUSE';
      throw new SandboxError('HOST_NOT_READY', `cannot set up sandbox networking: ${(error as Error).message}`, {
        cause: error,
        hint: busy
          ? `Another process holds ${this.proxyAddress}; give this instance its own subnet (EgressNetworkOptions.subnet) or data directory.`
          : 'Sandbox networking needs root, iproute2, nftables and util-linux (scripts/setup.sh installs them).',
      });
    });
    return this.starting;
  }

  /** Takes a namespace for the sandbox and registers its policy (and tenant) with the proxy. */
  async attach(sandboxId: string, policy: NetworkPolicy, tenantId?: string): Promise<NetworkAttachment> {
    await this.start();
    // One namespace per sandbox: one a reattach took back and then gave up (the sandbox is
    // recovered on a new one) goes first.
    if (this.slots.has(sandboxId)) await this.detach(sandboxId);
    const slot = await this.pool.take(sandboxId);
    this.slots.set(sandboxId, slot);
    this.proxy.register(sandboxId, slot.address, policy, tenantId);
    return this.attachment(slot);
  }

  /**
   * Takes back the namespace a sandbox kept while no server ran (its supervisor held it): the
   * slot recorded for it, its in-namespace rules loaded again (this start's proxy ports), and its
   * policy registered with the proxy, with the connections counted so far. Until then the proxy
   * refused the sandbox's address and nothing else was reachable from the namespace; the policy
   * given is the sandbox's record, the one in force when the previous server went.
   */
  async reattach(sandboxId: string, policy: NetworkPolicy, tenantId?: string): Promise<NetworkAttachment> {
    await this.start();
    const slot = await this.pool.reclaim(sandboxId);
    if (slot === undefined) {
      // A host fault (something deleted it), not the sandbox's end: the engine recovers it on its files.
      throw new SandboxError('HOST_NOT_READY', `the network namespace of sandbox ${sandboxId} is gone`, { details: { sandboxId } });
    }
    this.slots.set(sandboxId, slot);
    try {
      await applyRuleset(sandboxRuleset(this.proxyAddress, this.proxy.ports), slot.path);
      const record = await slotRecord(this.stateDir, slot.name);
      this.proxy.register(sandboxId, slot.address, policy, tenantId, { connections: record.connections });
    } catch (error) {
      // Not taken over: the sandbox is recovered on a new namespace, and this one must not stay ours.
      await this.detach(sandboxId).catch(() => undefined);
      throw error;
    }
    return this.attachment(slot);
  }

  private attachment(slot: NetnsSlot): NetworkAttachment {
    const proxyUrl = `http://${this.proxyAddress}:${this.proxy.ports.proxy}`;
    return {
      netnsPath: slot.path,
      address: slot.address,
      resolvConf: this.resolvConf,
      env: {
        HTTP_PROXY: proxyUrl, HTTPS_PROXY: proxyUrl, http_proxy: proxyUrl, https_proxy: proxyUrl,
        NO_PROXY: 'localhost,127.0.0.1,::1', no_proxy: 'localhost,127.0.0.1,::1',
      },
    };
  }

  /** The bound of a sandbox's lifetime connection count, in its slot's record (written whole, by rename). */
  private recordConnections(sandboxId: string, upTo: number): void {
    const slot = this.slots.get(sandboxId);
    if (!slot) return;
    const file = join(this.stateDir, slot.name);
    try {
      writeFileSync(`${file}.tmp`, `sandbox ${sandboxId}\nconnections ${upTo}\n`, { mode: 0o600 });
      renameSync(`${file}.tmp`, file);
    } catch (error) {
      // The old record stays whole; the proxy refuses the connection that needed the new one.
      rmSync(`${file}.tmp`, { force: true });
      throw error;
    }
  }

  /** Replaces the policy of a live sandbox; new connections follow at once. */
  setPolicy(sandboxId: string, policy: NetworkPolicy): void {
    this.proxy.update(sandboxId, policy);
  }

  stats(sandboxId: string): EgressStats | undefined {
    return this.proxy.stats(sandboxId);
  }

  /** Forgets the sandbox and deletes its namespace and veth. */
  async detach(sandboxId: string): Promise<void> {
    this.proxy.unregister(sandboxId);
    const slot = this.slots.get(sandboxId);
    if (!slot) return;
    this.slots.delete(sandboxId);
    await this.pool.release(slot);
  }

  /**
   * Lets go of a sandbox that keeps running under its supervisor (a stop that leaves it for the
   * next server): the proxy forgets it and this network no longer holds its slot, but its
   * namespace, slot file (with the connection bound), the host table and the anchor stay, so the
   * next start's `reattach` takes it back. Until then the sandbox reaches nothing.
   */
  letGo(sandboxId: string): void {
    this.proxy.unregister(sandboxId);
    if (this.slots.delete(sandboxId)) this.leftRunning.add(sandboxId);
  }

  /** Waits until the pool holds its ready namespaces. */
  async warm(): Promise<void> {
    await this.start();
    await this.pool.warm();
  }

  /**
   * Removes everything: sandbox namespaces still attached, the pool, proxy, rules, anchor. The
   * namespaces of sandboxes let go stay, and so do the host table and the anchor while there is one.
   */
  async close(): Promise<void> {
    if (!this.starting) return;
    await this.starting.catch(() => undefined);
    for (const id of [...this.slots.keys()]) await this.detach(id);
    await this.pool.close();
    await this.proxy.close();
    if (this.leftRunning.size === 0) await removeHostState(this.names);
    this.starting = undefined;
  }

  /** Whether a namespace of this instance belongs to this running network (pool or attached). */
  owns(netns: string): boolean {
    return this.pool.isIdle(netns) || [...this.slots.values()].some((slot) => slot.name === netns);
  }

  /**
   * After a crash: removes namespaces of this instance that neither this running network holds
   * (ready in its pool, attached or reattached here) nor a sandbox in `reattached` (taken over by
   * this start; its namespace is reattached after) owns, and, when no network of this instance
   * runs in this process, the anchor and host table too. A live sandbox that was not reattached
   * starts on a new namespace (or ends): its old one goes.
   */
  static async reconcile(
    host: HostEnvironment,
    _liveIds: ReadonlySet<string>,
    running?: EgressNetwork,
    reattached: ReadonlySet<string> = new Set(),
  ): Promise<{ removed: string[]; failures: string[] }> {
    const names = new NetworkNames(host.cgroupPrefix);
    const stateDir = join(host.dataDir, 'net', 'slots');
    const removed: string[] = [];
    const failures: string[] = [];
    for (const netns of await listInstanceNetns(names)) {
      if (running?.owns(netns)) continue;
      const owner = await slotOwner(stateDir, netns);
      if (owner !== undefined && owner !== 'idle' && reattached.has(owner)) continue;
      try {
        const slot = names.slotOf(netns);
        await destroyNetns(netns, slot === undefined ? undefined : names.veth(slot));
        await rm(join(stateDir, netns), { force: true });
        if (slot !== undefined) running?.pool.forget(slot);
        removed.push(`netns:${netns}`);
      } catch (error) {
        failures.push(`netns ${netns}: ${(error as Error).message}`);
      }
    }
    for (const file of await readdir(stateDir).catch(() => [] as string[])) {
      if (!running?.owns(file) && !(await listInstanceNetns(names)).includes(file)) await rm(join(stateDir, file), { force: true });
    }
    if (!running?.isStarted) {
      try {
        const hadHostState = await removeHostState(names);
        if (hadHostState) removed.push(`network:${names.table}`);
      } catch (error) {
        failures.push(`network ${names.table}: ${(error as Error).message}`);
      }
    }
    return { removed, failures };
  }

  private async doStart(): Promise<void> {
    const problem = await networkPrerequisitesProblem();
    if (problem) throw new Error(problem);
    // resolv.conf is read by sandboxes through a bind (a launcher fd): the directory is root's.
    await mkdir(join(this.options.host.dataDir, 'net'), { recursive: true, mode: 0o700 });
    await writeFile(this.resolvConf, `# Capsule: the egress proxy answers only names the policy allows.\nnameserver ${this.proxyAddress}\noptions timeout:1 attempts:1\n`, { mode: 0o644 });
    await ensureAnchor(this.names, this.proxyAddress);
    await applyRuleset(hostRuleset({
      table: this.names.table,
      vethPattern: this.names.vethPattern,
      proxyAddress: this.proxyAddress,
      subnet: this.subnet,
      ports: this.proxy.ports,
      connectionsPerSandbox: kernelConnectionCap(this.maxConcurrentConnections),
    }));
    await this.proxy.start();
    await this.pool.start();
  }
}

/** This process's soft RLIMIT_NOFILE (Node raises it to the hard limit at start); undefined when unlimited. */
function openFilesLimit(): number | undefined {
  try {
    return parseOpenFilesLimit(readFileSync('/proc/self/limits', 'utf8'));
  } catch {
    return undefined;
  }
}

/** Deletes the host table and the anchor of an instance; true when there was something. */
async function removeHostState(names: NetworkNames): Promise<boolean> {
  let found = false;
  for (const [family, table] of await listTables(names.table)) {
    if (table !== names.table) continue;
    await deleteTable(family, table);
    found = true;
  }
  const before = (await readdir('/sys/class/net').catch(() => [] as string[])).includes(names.anchor[0]);
  await removeAnchor(names);
  return found || before;
}

/** A /24 derived from the data directory, so that two instances on one host do not collide. */
function defaultSubnet(dataDir: string): string {
  const digest = createHash('sha256').update(`net:${resolve(dataDir)}`).digest();
  return `10.${200 + ((digest[0] ?? 0) % 50)}.${digest[1] ?? 0}.0/24`;
}
