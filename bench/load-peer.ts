/**
 * The floor under the load benchmark's create and density figures: the same isolation built from
 * the real tools directly, with no server in between. A peer sandbox is a bwrap that unshares
 * every namespace Capsule does (user with nesting disabled, pid, ipc, uts, cgroup, net), with
 * /usr read-only, its own /proc, /dev and /tmp and no capabilities, in its own v1 memory (+memsw),
 * pids and cpu groups with limits and a cgroup2 group to kill it by. It is ready when its pid 1
 * has written a line, and destroyed by cgroup.kill, then its groups are removed.
 *
 * It has no supervisor, agent, workspace, /etc, seccomp filter, records, audit or API; what
 * Capsule costs over it is the ratio the benchmark reports. Bounded like the rest: a count of
 * sandboxes, a time, and every group and process it made gone before it returns.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync, readFileSync, rmdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fleet, hostCost } from './load-fleet.js';
import { descendants } from './proc.js';

const CGROUP_ROOT = '/sys/fs/cgroup';
const V1_CONTROLLERS = ['memory', 'pids', 'cpu'] as const;
/** Long enough that a stuck kill is a bench failure, not a hang. */
const GONE_DEADLINE_MS = 10_000;

export interface PeerLimits {
  memoryBytes: number;
  pids: number;
  cpus: number;
}

const BWRAP_ARGS = [
  '--unshare-user', '--unshare-pid', '--unshare-ipc', '--unshare-uts', '--unshare-cgroup', '--unshare-net',
  '--disable-userns', '--die-with-parent', '--new-session', '--cap-drop', 'ALL',
  '--uid', '1000', '--gid', '1000', '--hostname', 'sandbox',
  '--ro-bind', '/usr', '/usr', '--symlink', 'usr/bin', '/bin', '--symlink', 'usr/lib', '/lib', '--symlink', 'usr/lib64', '/lib64',
  '--proc', '/proc', '--dev', '/dev', '--tmpfs', '/tmp', '--remount-ro', '/',
  '--as-pid-1', '--', '/bin/sh', '-c', 'echo ready; exec sleep 2147483647',
];

/** Joins the groups given as its first four arguments, then becomes bwrap (no process stays behind). */
const JOIN_THEN_EXEC = 'for f in "$1" "$2" "$3" "$4"; do echo $$ > "$f" || exit 1; done; shift 4; exec "$@"';

class PeerSandbox {
  private readonly exited: Promise<void>;

  constructor(
    readonly name: string,
    private readonly child: ChildProcess,
  ) {
    this.exited = new Promise((resolve) => child.once('close', () => resolve()));
  }

  private static dirs(name: string): string[] {
    return [...V1_CONTROLLERS.map((c) => join(CGROUP_ROOT, c, name)), join(CGROUP_ROOT, 'unified', name)];
  }

  static async start(name: string, limits: PeerLimits): Promise<PeerSandbox> {
    const dirs = PeerSandbox.dirs(name);
    for (const dir of dirs) mkdirSync(dir);
    const [memory, pids, cpu] = dirs as [string, string, string, string];
    writeFileSync(join(memory, 'memory.swappiness'), '0');
    writeFileSync(join(memory, 'memory.limit_in_bytes'), String(limits.memoryBytes));
    writeFileSync(join(memory, 'memory.memsw.limit_in_bytes'), String(limits.memoryBytes));
    writeFileSync(join(pids, 'pids.max'), String(limits.pids));
    writeFileSync(join(cpu, 'cpu.cfs_quota_us'), String(Math.round(limits.cpus * 100_000)));
    const child = spawn('/bin/sh', ['-c', JOIN_THEN_EXEC, 'peer', ...dirs.map((d) => join(d, 'cgroup.procs')), '/usr/bin/bwrap', ...BWRAP_ARGS], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const sandbox = new PeerSandbox(name, child);
    let stderr = '';
    child.stderr.on('data', (chunk: Buffer) => void (stderr.length < 500 && (stderr += chunk.toString())));
    try {
      await new Promise<void>((resolve, reject) => {
        child.stdout.once('data', () => resolve());
        child.once('error', reject);
        child.once('close', (code) => reject(new Error(`peer bwrap exited ${code} before it was ready: ${stderr.trim()}`)));
      });
    } catch (error) {
      await sandbox.kill();
      throw error;
    }
    return sandbox;
  }

  /** Kills every process in the group at once, waits for the group to empty, removes it. */
  async kill(): Promise<void> {
    const dirs = PeerSandbox.dirs(this.name);
    const unified = dirs[3]!;
    writeFileSync(join(unified, 'cgroup.kill'), '1');
    await this.exited;
    const deadline = performance.now() + GONE_DEADLINE_MS;
    while (/^populated 1$/m.test(readFileSync(join(unified, 'cgroup.events'), 'utf8'))) {
      if (performance.now() > deadline) throw new Error(`peer ${this.name}: still populated ${GONE_DEADLINE_MS} ms after cgroup.kill`);
      await sleep(2);
    }
    for (const dir of dirs) {
      for (;;) {
        try {
          rmdirSync(dir);
          break;
        } catch (error) {
          const code = (error as NodeJS.ErrnoException).code;
          if (code === 'ENOENT') break;
          if (code !== 'EBUSY' || performance.now() > deadline) throw error;
          await sleep(2);
        }
      }
    }
  }
}

/** Names no Capsule instance claims (its groups start with `capsule-`), unique to this process. */
function peerNamer(): () => string {
  let n = 0;
  return () => `bench-peer-${process.pid}-${n++}`;
}

async function killAllPeers(sandboxes: PeerSandbox[], clients: number): Promise<void> {
  const left = sandboxes.splice(0);
  let firstError: Error | undefined;
  await Promise.all(
    Array.from({ length: clients }, async () => {
      for (let sandbox = left.pop(); sandbox; sandbox = left.pop()) await sandbox.kill().catch((error: Error) => void (firstError ??= error));
    }),
  );
  if (firstError !== undefined) throw firstError;
}

export interface PeerCreateRates {
  live: number;
  clients: number;
  fillPerSecond: number;
  churnPerSecond: number;
  churnSeconds: number;
  errors: number;
  firstError?: string;
}

/** As createRates, for the peer: fill to `live`, then each client starts one and kills its oldest. */
export async function peerCreateRates(live: number, churnMs: number, clients: number, limits: PeerLimits): Promise<PeerCreateRates> {
  const name = peerNamer();
  const sandboxes: PeerSandbox[] = [];
  try {
    const run = await fleet(sandboxes, live, churnMs, clients, () => PeerSandbox.start(name(), limits), (sandbox) => sandbox.kill());
    return {
      live,
      clients,
      fillPerSecond: live / run.fillSeconds,
      churnPerSecond: run.churned / run.churnSeconds,
      churnSeconds: run.churnSeconds,
      errors: run.errors,
      ...(run.firstError !== undefined ? { firstError: run.firstError } : {}),
    };
  } finally {
    await killAllPeers(sandboxes, clients);
  }
}

export interface PeerDensity {
  sandboxes: number;
  hostMiBPerSandbox: number;
  pssMiBPerSandbox: number;
  kernelMiBPerSandbox: Record<string, number>;
  processes: number;
  errors: number;
  firstError?: string;
}

/** As idleDensity, for the peer: `count` idle peer sandboxes and what each costs the host. */
export async function peerIdleDensity(count: number, clients: number, limits: PeerLimits, otherChildren: number[]): Promise<PeerDensity> {
  const name = peerNamer();
  const sandboxes: PeerSandbox[] = [];
  try {
    const { result: run, ...cost } = await hostCost(
      () => fleet(sandboxes, count, 0, clients, () => PeerSandbox.start(name(), limits), () => Promise.resolve()),
      () => sandboxes.length,
      async () => {
        // This process's other children (a Capsule server and its sandboxes) are not the peer's.
        const others = new Set((await Promise.all(otherChildren.map(async (pid) => [pid, ...(await descendants(pid))]))).flat());
        return (await descendants(process.pid)).filter((pid) => !others.has(pid));
      },
    );
    return {
      sandboxes: sandboxes.length,
      ...cost,
      errors: run.errors,
      ...(run.firstError !== undefined ? { firstError: run.firstError } : {}),
    };
  } finally {
    await killAllPeers(sandboxes, clients);
  }
}
