import { readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { spawnSync } from 'node:child_process';
import { listSandboxCgroups } from '../../src/host/cgroups.host.js';
import { RANGE_BASE } from '../../src/host/uid-ranges.js';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { listInstanceLinks, listInstanceNetns, NetworkNames, slotOwner } from '../../src/host/netns-pool.host.js';

export interface Leaks {
  cgroups: string[];
  processes: string[];
  workspaces: string[];
  mounts: string[];
  /** gVisor containers in this instance's runsc state directory, and their bundles. */
  runsc: string[];
  /** Network namespaces and host veths of this instance, except namespaces a pool holds ready and the anchor. */
  network: string[];
  /** Template builds' pending layers, leases and temp dirs (a finished or failed build removes its own). */
  templates: string[];
  /** Sandbox supervisors (capsule-launch --supervise) of this instance: files in `<dataDir>/run`, and live ones. */
  supervisors: string[];
  /** Snapshots, volumes, clones and read-only views on the volume (tests delete what they make). */
  stored: string[];
  /**
   * Spare clones (SpareClones): an open engine keeps them, and clears them at close; so they are
   * leaks at the end of the run, not after each test of a file whose engine is still open.
   */
  spares: string[];
}

/**
 * Everything of this test run's Capsule instance still on the host: its cgroups, any process
 * descended from this test process (sandboxes, launchers, servers), its workspaces, and mounts
 * under its data directory other than the workspace volume itself.
 */
export async function findLeaks(dataDir: string): Promise<Leaks> {
  const host = new HostEnvironment({ dataDir });
  const cgroups = await listSandboxCgroups(host.cgroupPrefix);
  const processes = await descendants(process.pid);
  const workspaces = (await readdir(host.volume.mountPoint).catch(() => [] as string[])).filter((e) => e.startsWith('ws-') || e.startsWith('sb-'));
  const mountinfo = await readFile('/proc/self/mountinfo', 'utf8');
  const mounts = mountinfo
    .split('\n')
    .map((line) => line.split(' ')[4] ?? '')
    .filter((target) => target.startsWith(join(dataDir, '/')) && target !== host.volume.mountPoint);
  const runsc = [...(await runscContainers(dataDir)), ...(await gvisorBundles(dataDir))];
  return { cgroups, processes, workspaces, mounts, runsc, network: await networkLeaks(host), templates: await templateLeaks(dataDir, host.volume.mountPoint), supervisors: await supervisorLeaks(dataDir), stored: await storedLeaks(host.volume.mountPoint), spares: (await readdir(join(host.volume.mountPoint, 'spares')).catch(() => [] as string[])).map((name) => `spares/${name}`) };
}

/** What a template build leaves only while it runs: pending layers, leases, build temp dirs. */
async function templateLeaks(dataDir: string, volume: string): Promise<string[]> {
  const list = async (dir: string, what: string) => (await readdir(dir).catch(() => [] as string[])).map((name) => `${what} ${name}`);
  return [...(await list(join(volume, 'layers-pending'), 'pending layer')), ...(await list(join(volume, 'layer-leases'), 'lease')), ...(await list(join(dataDir, 'build-tmp'), 'build temp'))];
}

/**
 * Supervisors are daemons (their own session, reparented to init): not descendants of the test.
 * Found by their files under `<dataDir>/run` and by their command line naming that directory.
 */
export async function supervisorLeaks(dataDir: string): Promise<string[]> {
  const run = join(dataDir, 'run');
  const found = (await readdir(run).catch(() => [] as string[])).map((name) => `file run/${name}`);
  for (const entry of await readdir('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    const cmdline = await readFile(`/proc/${entry}/cmdline`, 'utf8').catch(() => '');
    const args = cmdline.split('\0');
    const at = args.indexOf('--supervise');
    if (at >= 0 && args[at + 1]?.startsWith(`${run}/`)) found.push(`supervisor ${entry} ${args[at + 1]}`);
  }
  return found;
}

/** Snapshots, volumes, clones and read-only views on the volume (tests delete what they make). */
async function storedLeaks(volume: string): Promise<string[]> {
  const stored: string[] = [];
  for (const dir of ['snapshots', 'volumes', 'clones', 'scratch']) {
    for (const entry of await readdir(join(volume, dir)).catch(() => [] as string[])) stored.push(`${dir}/${entry}`);
  }
  return stored;
}

/** Sandbox namespaces and veths of this instance; a pool's ready namespaces (state "idle") are not leaks. */
async function networkLeaks(host: HostEnvironment): Promise<string[]> {
  const names = new NetworkNames(host.cgroupPrefix);
  const stateDir = join(host.dataDir, 'net', 'slots');
  const idleSlots = new Set<number>();
  const leaked: string[] = [];
  for (const netns of await listInstanceNetns(names)) {
    const slot = names.slotOf(netns);
    if (slot !== undefined && (await slotOwner(stateDir, netns)) === 'idle') idleSlots.add(slot);
    else leaked.push(`netns ${netns}`);
  }
  for (const link of await listInstanceLinks(names)) {
    if (names.anchor.includes(link)) continue;
    const slot = /h(\d+)$/.exec(link)?.[1];
    if (slot === undefined || !idleSlots.has(Number(slot))) leaked.push(`veth ${link}`);
  }
  return leaked;
}

/** Live descendants of `root` as "pid name"; zombies count: nobody reaped them. */
export async function descendants(root: number): Promise<string[]> {
  const parents = new Map<number, number>();
  const names = new Map<number, string>();
  for (const entry of await readdir('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    const stat = await readFile(`/proc/${entry}/stat`, 'utf8').catch(() => '');
    const match = /^\d+ \((.*)\) \S+ (\d+)/s.exec(stat);
    if (!match) continue;
    parents.set(Number(entry), Number(match[2]));
    names.set(Number(entry), match[1] ?? '?');
  }
  const found: string[] = [];
  for (const [pid] of parents) {
    // The server's process starter (src/host/spawner.host.ts) lives as long as the server does,
    // here this test process; what it started is still found below it.
    if (parents.get(pid) === root && names.get(pid) === 'capsule-spawn') continue;
    let cursor = parents.get(pid);
    for (let hops = 0; cursor !== undefined && cursor > 1 && hops < 64; hops++) {
      if (cursor === root) {
        found.push(`${pid} ${names.get(pid)}`);
        break;
      }
      cursor = parents.get(cursor);
    }
  }
  return found;
}

/** Processes whose host uid is a sandbox's: the single uids of host-template sandboxes, or a template sandbox's range (used while a sandbox runs). */
export async function sandboxUidProcesses(): Promise<{ pid: number; uid: number; name: string }[]> {
  const found: { pid: number; uid: number; name: string }[] = [];
  for (const entry of await readdir('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    const status = await readFile(`/proc/${entry}/status`, 'utf8').catch(() => '');
    const uid = Number(/^Uid:\s+(\d+)/m.exec(status)?.[1] ?? -1);
    if ((uid >= 3_000_000 && uid < 4_000_000) || uid >= RANGE_BASE) found.push({ pid: Number(entry), uid, name: /^Name:\s+(.*)$/m.exec(status)?.[1] ?? '?' });
  }
  return found;
}

export function describeLeaks(leaks: Leaks): string {
  return Object.entries(leaks)
    .filter(([, list]) => (list as string[]).length > 0)
    .map(([kind, list]) => `${kind}: ${(list as string[]).join(', ')}`)
    .join('; ');
}

/** Containers runsc still knows in this instance's state directory (`<dataDir>/runsc`). */
export async function runscContainers(dataDir: string): Promise<string[]> {
  const root = join(dataDir, 'runsc');
  if (!(await readdir(root).catch(() => undefined))) return [];
  const result = spawnSync('runsc', ['--root', root, 'list', '--quiet'], { encoding: 'utf8', timeout: 10_000 });
  if (result.status !== 0) return [];
  return result.stdout.split('\n').filter((line) => line.trim() !== '').map((id) => `container ${id.trim()}`);
}

/** OCI bundles and checkpoints of gVisor sandboxes still on disk. */
async function gvisorBundles(dataDir: string): Promise<string[]> {
  const bundles = await readdir(join(dataDir, 'gvisor', 'bundles')).catch(() => [] as string[]);
  const checkpoints = await readdir(join(dataDir, 'checkpoints')).catch(() => [] as string[]);
  return [...bundles.map((id) => `bundle ${id}`), ...checkpoints.map((id) => `checkpoint ${id}`)];
}
