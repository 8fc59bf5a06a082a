import { mkdir, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { SandboxError } from '../errors/index.js';
import { pathExists } from './fs-util.js';
import { runCommand } from './run-command.host.js';
import { applyRuleset } from './nftables.host.js';

export const NETNS_DIR = '/run/netns';

/** Names of one Capsule instance's network objects, all derived from its cgroup prefix. */
export class NetworkNames {
  /** e.g. `capsule-1a2b3c-`: netns are `<prefix>n<slot>`. */
  readonly netnsPrefix: string;
  /** e.g. `cp1a2b3c`: links are `<linkPrefix>h<slot>` (sandboxes) and `<linkPrefix>a|b` (anchor). */
  readonly linkPrefix: string;
  /** nft table on the host, e.g. `capsule_1a2b3c`. */
  readonly table: string;

  constructor(cgroupPrefix: string) {
    const hex = /^capsule-([0-9a-f]{6})-$/.exec(cgroupPrefix)?.[1];
    if (!hex) throw new Error(`unexpected cgroup prefix ${cgroupPrefix}`);
    this.netnsPrefix = cgroupPrefix;
    this.linkPrefix = `cp${hex}`;
    this.table = `capsule_${hex}`;
  }

  netns(slot: number): string {
    return `${this.netnsPrefix}n${slot}`;
  }

  veth(slot: number): string {
    return `${this.linkPrefix}h${slot}`;
  }

  get vethPattern(): string {
    return `${this.linkPrefix}h*`;
  }

  get anchor(): [string, string] {
    return [`${this.linkPrefix}a`, `${this.linkPrefix}b`];
  }

  slotOf(netns: string): number | undefined {
    const match = new RegExp(`^${this.netnsPrefix}n(\\d+)$`).exec(netns);
    return match ? Number(match[1]) : undefined;
  }
}

/** Network namespaces of this instance present on the host now. */
export async function listInstanceNetns(names: NetworkNames): Promise<string[]> {
  const entries = await readdir(NETNS_DIR).catch(() => [] as string[]);
  return entries.filter((entry) => entry.startsWith(names.netnsPrefix));
}

/** Host interfaces of this instance present now (sandbox veths and the anchor). */
export async function listInstanceLinks(names: NetworkNames): Promise<string[]> {
  const entries = await readdir('/sys/class/net').catch(() => [] as string[]);
  return entries.filter((entry) => entry.startsWith(names.linkPrefix));
}

/**
 * The anchor: a veth pair that stays while the instance runs and holds the proxy's address
 * (this kernel has no dummy driver). The proxy binds that address, never 0.0.0.0.
 */
export async function ensureAnchor(names: NetworkNames, proxyAddress: string): Promise<void> {
  const [a, b] = names.anchor;
  const links = await listInstanceLinks(names);
  if (!links.includes(a)) {
    await runCommand(['ip', '-b', '-'], {
      input: `link add ${a} type veth peer name ${b}\naddr add ${proxyAddress}/32 dev ${a}\nlink set ${b} up\nlink set ${a} up\n`,
      timeoutMs: 10_000,
    });
  }
}

export async function removeAnchor(names: NetworkNames): Promise<void> {
  const [a] = names.anchor;
  if ((await listInstanceLinks(names)).includes(a)) await runCommand(['ip', 'link', 'del', a], { timeoutMs: 10_000 });
}

/** One sandbox's network: a namespace with `eth0` (its `address`) whose peer is on the host. */
export interface NetnsSlot {
  slot: number;
  name: string;
  /** Path the launcher enters (`--netns`). */
  path: string;
  address: string;
}

export interface NetnsPoolOptions {
  names: NetworkNames;
  /** First three octets of the instance's /24, e.g. `10.213.7`. */
  subnetBase: string;
  proxyAddress: string;
  /** Ruleset loaded inside every namespace. */
  ruleset: string;
  /** Directory recording which sandbox holds which slot (for reconcile after a crash). */
  stateDir: string;
  /** Namespaces kept ready. @default 2 */
  size?: number;
}

const FIRST_SLOT = 2;
/** Every veth pair is its own link, so one pair of locally administered MACs serves them all. */
const HOST_END_MAC = '02:ca:75:00:00:01';
const SANDBOX_END_MAC = '02:ca:75:00:00:02';
const REFILL_DELAY_MS = 150;
const LAST_SLOT = 254;

/**
 * Ready-made network namespaces. Making one costs three process spawns (~15-25 ms); taking one
 * from the pool costs a file write. Destroying one is `ip netns del`: the kernel removes the veth
 * pair and its route with the namespace.
 */
export class NetnsPool {
  private readonly options: NetnsPoolOptions;
  private readonly size: number;
  private readonly idle: NetnsSlot[] = [];
  private readonly used = new Set<number>();
  /** Namespaces being made (recorded `idle`, not yet handed out): the pool's, as the idle ones are. */
  private readonly making = new Set<string>();
  private filling: Promise<void> | undefined;
  private closed = false;
  private nextSlot = FIRST_SLOT;
  private refillTimer: NodeJS.Timeout | undefined;
  /** Failures of background refills, counted; the next take() creates on demand instead. */
  fillFailures = 0;
  lastFillError: string | undefined;

  constructor(options: NetnsPoolOptions) {
    this.options = options;
    this.size = options.size ?? 2;
  }

  /**
   * Called once this process holds the instance's proxy address (so no other live process of the
   * instance exists): ready namespaces an earlier process left (a one-shot run that exited, a
   * crash) are deleted; namespaces recorded for a sandbox are left to reconcile, and their slots
   * are not reused.
   */
  async start(): Promise<void> {
    await mkdir(this.options.stateDir, { recursive: true, mode: 0o700 });
    const { names } = this.options;
    for (const name of await listInstanceNetns(names)) {
      const slot = names.slotOf(name);
      if (slot === undefined) continue;
      const owner = await slotOwner(this.options.stateDir, name);
      if (owner === 'idle' || owner === undefined) {
        await destroyNetns(name, names.veth(slot));
        await rm(join(this.options.stateDir, name), { force: true });
      } else {
        this.used.add(slot);
      }
    }
    this.refill();
  }

  /** A namespace for `sandboxId`: from the pool when one is ready, else made now. */
  async take(sandboxId: string): Promise<NetnsSlot> {
    const slot = this.idle.shift() ?? (await this.create());
    // From here until the caller records it (EgressNetwork.slots) nothing counts it as ours:
    // safe because reconcile runs only at start-up, before any take().
    this.making.delete(slot.name);
    await writeFile(join(this.options.stateDir, slot.name), `sandbox ${sandboxId}\n`);
    // Refill a little later: the spawns of a refill would otherwise compete with the sandbox
    // start that just took the namespace (2 cores).
    this.refillTimer ??= setTimeout(() => {
      this.refillTimer = undefined;
      this.refill();
    }, REFILL_DELAY_MS);
    this.refillTimer.unref();
    return slot;
  }

  /**
   * The namespace an earlier process of the instance gave `sandboxId` (its slot file says so), if
   * it still exists; `start()` kept it out of the pool. Undefined when there is none.
   */
  async reclaim(sandboxId: string): Promise<NetnsSlot | undefined> {
    const { names, subnetBase } = this.options;
    for (const name of await listInstanceNetns(names)) {
      const slot = names.slotOf(name);
      if (slot === undefined || (await slotOwner(this.options.stateDir, name)) !== sandboxId) continue;
      this.used.add(slot);
      return { slot, name, path: join(NETNS_DIR, name), address: `${subnetBase}.${slot}` };
    }
    return undefined;
  }

  /** Deletes a sandbox's namespace (with its veth pair). */
  async release(slot: NetnsSlot): Promise<void> {
    try {
      await destroyNetns(slot.name, this.options.names.veth(slot.slot));
      await rm(join(this.options.stateDir, slot.name), { force: true });
    } finally {
      this.used.delete(slot.slot);
    }
  }

  /** A slot whose namespace an earlier process left and reconcile deleted: free for new ones. */
  forget(slot: number): void {
    this.used.delete(slot);
  }

  /**
   * Whether `name` is a namespace this pool holds ready or is making (not a leak, not an orphan):
   * a start-up reconcile that runs while the pool fills must not delete one half made, which the
   * pool would then hand to a sandbox whose launch finds no namespace.
   */
  isIdle(name: string): boolean {
    return this.making.has(name) || this.idle.some((slot) => slot.name === name);
  }

  isUsed(name: string): boolean {
    const slot = this.options.names.slotOf(name);
    return slot !== undefined && this.used.has(slot);
  }

  /** Waits for the background refill (benchmarks and tests want a warm pool). */
  async warm(): Promise<void> {
    if (this.refillTimer) {
      clearTimeout(this.refillTimer);
      this.refillTimer = undefined;
      this.refill();
    }
    while (this.filling) await this.filling;
  }

  async close(): Promise<void> {
    this.closed = true;
    clearTimeout(this.refillTimer);
    await this.filling?.catch(() => undefined);
    for (const slot of this.idle.splice(0)) await this.release(slot);
  }

  private refill(): void {
    if (this.filling || this.closed || this.idle.length >= this.size) return;
    this.filling = (async () => {
      while (!this.closed && this.idle.length < this.size) {
        const slot = await this.create();
        this.idle.push(slot);
        this.making.delete(slot.name);
      }
    })()
      .catch((error: Error) => {
        this.fillFailures += 1;
        this.lastFillError = error.message;
      })
      .finally(() => {
        this.filling = undefined;
      });
  }

  private async create(): Promise<NetnsSlot> {
    const { names, subnetBase, proxyAddress } = this.options;
    // Round-robin: the kernel removes a deleted namespace's veth asynchronously, so a slot just
    // released may still have its interface for a few milliseconds.
    let slot: number | undefined;
    for (let step = 0; step <= LAST_SLOT - FIRST_SLOT && slot === undefined; step++) {
      const candidate = FIRST_SLOT + ((this.nextSlot - FIRST_SLOT + step) % (LAST_SLOT - FIRST_SLOT + 1));
      if (!this.used.has(candidate)) slot = candidate;
    }
    if (slot === undefined) {
      throw new SandboxError('QUOTA_EXCEEDED', `all ${LAST_SLOT - FIRST_SLOT + 1} sandbox network slots of ${subnetBase}.0/24 are in use`, {
        hint: 'Destroy networked sandboxes you no longer need, or run another Capsule instance with its own data directory.',
      });
    }
    this.nextSlot = slot + 1 > LAST_SLOT ? FIRST_SLOT : slot + 1;
    this.used.add(slot);
    const name = names.netns(slot);
    const veth = names.veth(slot);
    const address = `${subnetBase}.${slot}`;
    this.making.add(name);
    try {
      // Recorded first: a namespace being made belongs to the pool, never to nobody.
      await writeFile(join(this.options.stateDir, name), 'idle\n');
      // Fixed MACs and permanent neighbour entries on both ends: no ARP is needed, so hosts with
      // arp_ignore/arp_filter hardening (the proxy address lives on the anchor, not this veth) work.
      await runCommand(['ip', '-b', '-'], {
        input:
          `netns add ${name}\nlink add ${veth} address ${HOST_END_MAC} type veth peer name eth0 address ${SANDBOX_END_MAC} netns ${name}\n` +
          `link set ${veth} up\nroute add ${address}/32 dev ${veth}\nneigh replace ${address} lladdr ${SANDBOX_END_MAC} dev ${veth} nud permanent\n`,
        timeoutMs: 10_000,
      });
      await runCommand(['ip', '-n', name, '-b', '-'], {
        input:
          `link set lo up\naddr add ${address}/32 dev eth0\nlink set eth0 up\nroute add ${proxyAddress}/32 dev eth0\n` +
          `route add default via ${proxyAddress} dev eth0 onlink\nneigh replace ${proxyAddress} lladdr ${HOST_END_MAC} dev eth0 nud permanent\n`,
        timeoutMs: 10_000,
      });
      await applyRuleset(this.options.ruleset, join(NETNS_DIR, name));
    } catch (error) {
      await destroyNetns(name, veth).catch(() => undefined);
      await rm(join(this.options.stateDir, name), { force: true });
      this.used.delete(slot);
      this.making.delete(name);
      throw error;
    }
    return { slot, name, path: join(NETNS_DIR, name), address };
  }
}

/**
 * Deletes a namespace and, when `veth` is given, its veth pair. The pair is deleted first and
 * explicitly: that is synchronous, whereas the kernel removes the veth of a deleted namespace from
 * a shared work queue that can lag for seconds on a busy host. One `ip -force -b` spawn does both;
 * a part already gone is fine, and what is still present afterwards is an error.
 */
export async function destroyNetns(name: string, veth?: string): Promise<void> {
  const input = `${veth === undefined ? '' : `link del ${veth}\n`}netns del ${name}\n`;
  const result = await runCommand(['ip', '-force', '-b', '-'], { input, check: false, timeoutMs: 10_000 });
  if (await pathExists(join(NETNS_DIR, name))) {
    throw new Error(`ip netns del ${name} failed: ${result.stderr.trim()}`);
  }
  if (veth === undefined) return;
  for (let waitedMs = 0; waitedMs < VETH_GONE_TIMEOUT_MS; waitedMs += 5) {
    if (!(await pathExists(`/sys/class/net/${veth}`))) return;
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
  throw new Error(`veth ${veth} of ${name} is still present ${VETH_GONE_TIMEOUT_MS} ms after it was deleted: ${result.stderr.trim()}`);
}

const VETH_GONE_TIMEOUT_MS = 2000;

/** What a slot's state file records of its sandbox: the connections counted up to (see EgressProxy). */
export async function slotRecord(stateDir: string, name: string): Promise<{ connections?: number }> {
  const text = await readFile(join(stateDir, name), 'utf8').catch(() => '');
  const connections = /^connections (\d+)$/m.exec(text)?.[1];
  return connections === undefined ? {} : { connections: Number(connections) };
}

/** Who holds a slot according to its state file: `idle`, a sandbox id, or unknown. */
export async function slotOwner(stateDir: string, name: string): Promise<string | undefined> {
  const text = await readFile(join(stateDir, name), 'utf8').catch(() => '');
  return /^sandbox (\S+)/.exec(text)?.[1] ?? (text.startsWith('idle') ? 'idle' : undefined);
}
