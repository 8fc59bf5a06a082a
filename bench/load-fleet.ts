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

/** Fills to `live` sandboxes, then churns for `churnMs` at that level; kills them all after. */
export async function createRates(conn: ConnectionOptions, live: number, churnMs: number, options: FleetOptions): Promise<CreateRates> {
  const sandboxes: Sandbox[] = [];
  const latencies: number[] = [];
  const kills: number[] = [];
  const doneAt: number[] = [];
  let errors = 0;
  let firstError: string | undefined;
  const createOne = async (): Promise<Sandbox | undefined> => {
    const t0 = performance.now();
    try {
      const sandbox = await Sandbox.create({ ttlMs: 3_600_000, ...options.spec }, conn);
      latencies.push(performance.now() - t0);
      return sandbox;
    } catch (error) {
      errors++;
      firstError ??= String(error);
      return undefined;
    }
  };
  try {
    const start = performance.now();
    let next = 0;
    await Promise.all(
      Array.from({ length: options.clients }, async () => {
        while (next < live) {
          next++;
          const sandbox = await createOne();
          if (sandbox) sandboxes.push(sandbox);
          doneAt.push(performance.now());
        }
      }),
    );
    const fillSeconds = (performance.now() - start) / 1000;
    const fifth = Math.max(1, Math.floor(doneAt.length / 5));
    const lastFifthSeconds = (doneAt[doneAt.length - 1]! - doneAt[doneAt.length - 1 - fifth]!) / 1000;
    // Churn: the live count stays where it is, creates go on.
    let churned = 0;
    const churnStart = performance.now();
    const churnEnd = churnStart + churnMs;
    await Promise.all(
      Array.from({ length: options.clients }, async () => {
        while (performance.now() < churnEnd) {
          const fresh = await createOne();
          if (!fresh) continue;
          churned++;
          sandboxes.push(fresh);
          const t0 = performance.now();
          await sandboxes.shift()?.kill().catch(() => undefined);
          kills.push(performance.now() - t0);
        }
      }),
    );
    const churnSeconds = (performance.now() - churnStart) / 1000;
    const sorted = [...latencies].sort((a, b) => a - b);
    const killsSorted = [...kills].sort((a, b) => a - b);
    return {
      live,
      clients: options.clients,
      fillPerSecond: live / fillSeconds,
      fillLastFifthPerSecond: fifth / lastFifthSeconds,
      churnPerSecond: churned / churnSeconds,
      churnSeconds,
      createP50Ms: percentile(sorted, 50),
      createP99Ms: percentile(sorted, 99),
      killP50Ms: percentile(killsSorted, 50),
      killP99Ms: percentile(killsSorted, 99),
      errors,
      ...(firstError !== undefined ? { firstError } : {}),
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
  let errors = 0;
  let firstError: string | undefined;
  try {
    const availableBefore = await memAvailable();
    const kernelBefore = await kernelMemory();
    const rssBefore = await serverRss();
    let next = 0;
    await Promise.all(
      Array.from({ length: options.clients }, async () => {
        while (next < count) {
          next++;
          try {
            sandboxes.push(await Sandbox.create({ ttlMs: 3_600_000, ...options.spec }, conn));
          } catch (error) {
            errors++;
            firstError ??= String(error);
          }
        }
      }),
    );
    const made = Math.max(1, sandboxes.length);
    const availableAfter = await memAvailable();
    const kernelAfter = await kernelMemory();
    const rssAfter = await serverRss();
    const pids = await descendants(serverPid);
    let pss = 0;
    for (const pid of pids) pss += await pssBytes(pid);
    return {
      sandboxes: sandboxes.length,
      hostMiBPerSandbox: (availableBefore - availableAfter) / made / MiB,
      pssMiBPerSandbox: pss / made / MiB,
      serverMiBPerSandbox: (rssAfter - rssBefore) / made / MiB,
      kernelMiBPerSandbox: Object.fromEntries(KERNEL_FIELDS.map((field) => [field, ((kernelAfter[field] ?? 0) - (kernelBefore[field] ?? 0)) / made / MiB])),
      processes: pids.length,
      errors,
      ...(firstError !== undefined ? { firstError } : {}),
    };
  } finally {
    await killAll(sandboxes, options.clients);
  }
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

export async function kernelMemory(): Promise<Record<string, number>> {
  const text = await readFile('/proc/meminfo', 'utf8');
  return Object.fromEntries(KERNEL_FIELDS.map((field) => [field, Number(new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(text)?.[1] ?? 0) * 1024]));
}

export async function memAvailable(): Promise<number> {
  return Number(/^MemAvailable:\s+(\d+) kB/m.exec(await readFile('/proc/meminfo', 'utf8'))?.[1] ?? 0) * 1024;
}

