/**
 * Many sandboxes at once for the load benchmark: creates at a fill and at a steady churn, and the
 * host memory an idle one costs. Every phase is bounded by a count and a time.
 */
import { readFile } from 'node:fs/promises';
import { Sandbox, type ConnectionOptions } from '../src/sdk/index.js';
import { descendants, pssBytes } from './proc.js';
import { percentile } from './stats.js';

const MiB = 1024 * 1024;

export interface FleetOptions {
  /** Sandboxes created concurrently. */
  clients: number;
  spec: Record<string, unknown>;
}

export interface CreateRates {
  live: number;
  clients: number;
  /** Creates per second over the whole fill, 0 → live. */
  fillPerSecond: number;
  /** Creates per second over the last fifth of the fill (the rate with most sandboxes live). */
  fillLastFifthPerSecond: number;
  /** Creates per second while `live` stay live: each client creates one and kills its oldest. */
  churnPerSecond: number;
  churnSeconds: number;
  createP50Ms: number;
  createP99Ms: number;
  /** How long a kill took in the churn (the SDK's call, until the server answered). */
  killP50Ms: number;
  killP99Ms: number;
  errors: number;
  firstError?: string;
}

/** What `fleet` measured: the fill's and the churn's pace, with each kill's time in the churn. */
export interface FleetRun {
  fillSeconds: number;
  /** When each of the fill's starts ended (performance.now()), in order. */
  doneAt: number[];
  churned: number;
  churnSeconds: number;
  killMs: number[];
  errors: number;
  firstError?: string;
}

/**
 * Fills `held` to `live` with `clients` starting at once, then churns for `churnMs` at that
 * level: each client starts one and kills its oldest. A failed start is counted, not thrown. What
 * is left in `held` is the caller's to kill (also after a throw). Capsule's and the peer's runs
 * share it, so their figures are made the same way.
 */
export async function fleet<T>(
  held: T[],
  live: number,
  churnMs: number,
  clients: number,
  start: () => Promise<T>,
  kill: (item: T) => Promise<void>,
): Promise<FleetRun> {
  const run: FleetRun = { fillSeconds: 0, doneAt: [], churned: 0, churnSeconds: 0, killMs: [], errors: 0 };
  const startOne = async (): Promise<T | undefined> => {
    try {
      return await start();
    } catch (error) {
      run.errors++;
      run.firstError ??= String(error);
      return undefined;
    }
  };
  const clientsAtOnce = (body: () => Promise<void>) => Promise.all(Array.from({ length: clients }, body));
  const fillStart = performance.now();
  let next = 0;
  await clientsAtOnce(async () => {
    while (next < live) {
      next++;
      const item = await startOne();
      if (item !== undefined) held.push(item);
      run.doneAt.push(performance.now());
    }
  });
  run.fillSeconds = (performance.now() - fillStart) / 1000;
  // Churn: the live count stays where it is, starts go on.
  const churnStart = performance.now();
  const churnEnd = churnStart + churnMs;
  if (churnMs > 0) {
    await clientsAtOnce(async () => {
      while (performance.now() < churnEnd) {
        const fresh = await startOne();
        if (fresh === undefined) continue;
        run.churned++;
        held.push(fresh);
        const oldest = held.shift();
        const t0 = performance.now();
        if (oldest !== undefined) await kill(oldest);
        run.killMs.push(performance.now() - t0);
      }
    });
  }
  run.churnSeconds = (performance.now() - churnStart) / 1000;
  return run;
}

/** Fills to `live` sandboxes, then churns for `churnMs` at that level; kills them all after. */
export async function createRates(conn: ConnectionOptions, live: number, churnMs: number, options: FleetOptions): Promise<CreateRates> {
  const sandboxes: Sandbox[] = [];
  const latencies: number[] = [];
  try {
    const run = await fleet(
      sandboxes,
      live,
      churnMs,
      options.clients,
      async () => {
        const t0 = performance.now();
        const sandbox = await Sandbox.create({ ttlMs: 3_600_000, ...options.spec }, conn);
        latencies.push(performance.now() - t0);
        return sandbox;
      },
      async (sandbox) => void (await sandbox.kill().catch(() => undefined)),
    );
    const { doneAt } = run;
    const fifth = Math.max(1, Math.floor(doneAt.length / 5));
    const lastFifthSeconds = (doneAt[doneAt.length - 1]! - doneAt[doneAt.length - 1 - fifth]!) / 1000;
    const sorted = [...latencies].sort((a, b) => a - b);
    const killsSorted = [...run.killMs].sort((a, b) => a - b);
    return {
      live,
      clients: options.clients,
      fillPerSecond: live / run.fillSeconds,
      fillLastFifthPerSecond: fifth / lastFifthSeconds,
      churnPerSecond: run.churned / run.churnSeconds,
      churnSeconds: run.churnSeconds,
      createP50Ms: percentile(sorted, 50),
      createP99Ms: percentile(sorted, 99),
      killP50Ms: percentile(killsSorted, 50),
      killP99Ms: percentile(killsSorted, 99),
      errors: run.errors,
      ...(run.firstError !== undefined ? { firstError: run.firstError } : {}),
    };
  } finally {
    await killAll(sandboxes, options.clients);
  }
}

export interface IdleDensity {
  sandboxes: number;
  /** MemAvailable before less after, per sandbox: what the host gave up for each. */
  hostMiBPerSandbox: number;
  /** The PSS of the sandboxes' processes (launcher, bwrap, agent) per sandbox. */
  pssMiBPerSandbox: number;
  /** The server's RSS growth per sandbox. */
  serverMiBPerSandbox: number;
  /** Kernel memory per sandbox by /proc/meminfo field (Slab, Percpu, KernelStack, PageTables, Shmem), MiB. */
  kernelMiBPerSandbox: Record<string, number>;
  processes: number;
  errors: number;
  firstError?: string;
}

/** `count` idle sandboxes: what each costs the host. */
export async function idleDensity(conn: ConnectionOptions, count: number, serverPid: number, serverRss: () => Promise<number>, options: FleetOptions): Promise<IdleDensity> {
  const sandboxes: Sandbox[] = [];
  try {
    const rssBefore = await serverRss();
    const { result: run, ...cost } = await hostCost(
      () => fleet(sandboxes, count, 0, options.clients, () => Sandbox.create({ ttlMs: 3_600_000, ...options.spec }, conn), () => Promise.resolve()),
      () => sandboxes.length,
      () => descendants(serverPid),
    );
    const rssAfter = await serverRss();
    return {
      sandboxes: sandboxes.length,
      ...cost,
      serverMiBPerSandbox: (rssAfter - rssBefore) / Math.max(1, sandboxes.length) / MiB,
      errors: run.errors,
      ...(run.firstError !== undefined ? { firstError: run.firstError } : {}),
    };
  } finally {
    await killAll(sandboxes, options.clients);
  }
}

/** What the host gave up for each of the sandboxes `fill` made (`count()` of them). */
export interface HostCost {
  hostMiBPerSandbox: number;
  pssMiBPerSandbox: number;
  kernelMiBPerSandbox: Record<string, number>;
  processes: number;
}

/** MemAvailable and the kernel's fields before and after `fill`, and the PSS of `pids()` after, per sandbox. */
export async function hostCost<R>(fill: () => Promise<R>, count: () => number, pids: () => Promise<number[]>): Promise<HostCost & { result: R }> {
  const availableBefore = await memAvailable();
  const kernelBefore = await kernelMemory();
  const result = await fill();
  const made = Math.max(1, count());
  const availableAfter = await memAvailable();
  const kernelAfter = await kernelMemory();
  const found = await pids();
  let pss = 0;
  for (const pid of found) pss += await pssBytes(pid);
  return {
    hostMiBPerSandbox: (availableBefore - availableAfter) / made / MiB,
    pssMiBPerSandbox: pss / made / MiB,
    kernelMiBPerSandbox: Object.fromEntries(KERNEL_FIELDS.map((field) => [field, ((kernelAfter[field] ?? 0) - (kernelBefore[field] ?? 0)) / made / MiB])),
    processes: found.length,
    result,
  };
}

export async function killAll(sandboxes: Sandbox[], clients: number): Promise<void> {
  const left = sandboxes.splice(0);
  await Promise.all(
    Array.from({ length: clients }, async () => {
      for (let sandbox = left.pop(); sandbox; sandbox = left.pop()) await sandbox.kill().catch(() => undefined);
    }),
  );
}

/** Where the kernel's own memory for a sandbox shows in /proc/meminfo (its namespaces, cgroups, mounts, page tables). */
const KERNEL_FIELDS = ['SUnreclaim', 'SReclaimable', 'Percpu', 'KernelStack', 'PageTables', 'Shmem'];

async function kernelMemory(): Promise<Record<string, number>> {
  const text = await readFile('/proc/meminfo', 'utf8');
  return Object.fromEntries(KERNEL_FIELDS.map((field) => [field, Number(new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(text)?.[1] ?? 0) * 1024]));
}

export async function memAvailable(): Promise<number> {
  return Number(/^MemAvailable:\s+(\d+) kB/m.exec(await readFile('/proc/meminfo', 'utf8'))?.[1] ?? 0) * 1024;
}

