/**
 * Concurrent execs: C clients, each running `commands.run(['true'])` in a loop on one of S
 * sandboxes for a fixed time. Every request's latency is kept with its client and its place in
 * that client's sequence, so a stall shows where it falls (first requests, one client, one
 * sandbox) rather than only as a maximum.
 */
import { Sandbox, type ConnectionOptions } from '../src/sdk/index.js';
import { percentile } from './stats.js';

export interface ExecLoadOptions {
  clients: number;
  sandboxes: number;
  durationMs: number;
  /** Added to each sandbox's spec. */
  spec: Record<string, unknown>;
}

export interface ExecLoadResult {
  clients: number;
  sandboxes: number;
  seconds: number;
  execs: number;
  errors: number;
  firstError?: string;
  perSecond: number;
  p50Ms: number;
  p99Ms: number;
  maxMs: number;
  /** Requests over 1 s, and how many of them were their client's first or second. */
  over1s: number;
  over1sFirstOrSecond: number;
  /** The slowest requests: client index, place in its sequence, latency. */
  slowest: { client: number; seq: number; ms: number }[];
  /** Latency of each client's first request, p50 and max (a stall at the start shows here). */
  firstP50Ms: number;
  firstMaxMs: number;
}

export async function execLoad(conn: ConnectionOptions, options: ExecLoadOptions): Promise<ExecLoadResult> {
  const sandboxes: Sandbox[] = [];
  try {
    for (let i = 0; i < options.sandboxes; i++) sandboxes.push(await Sandbox.create({ ttlMs: options.durationMs + 600_000, ...options.spec }, conn));
    // One exec each first: the run measures steady state, not each sandbox's first process.
    await Promise.all(sandboxes.map((s) => s.commands.run(['true'])));
    const samples: { client: number; seq: number; ms: number }[] = [];
    let errors = 0;
    let firstError: string | undefined;
    const start = performance.now();
    const deadline = start + options.durationMs;
    const client = async (index: number): Promise<void> => {
      const sandbox = sandboxes[index % sandboxes.length]!;
      for (let seq = 0; performance.now() < deadline; seq++) {
        const t0 = performance.now();
        try {
          const result = await sandbox.commands.run(['true']);
          if (result.exitCode !== 0) throw new Error(`true exited ${result.exitCode} (${result.outcome})`);
        } catch (error) {
          errors++;
          firstError ??= String(error);
        }
        samples.push({ client: index, seq, ms: performance.now() - t0 });
      }
    };
    await Promise.all(Array.from({ length: options.clients }, (_, i) => client(i)));
    const seconds = (performance.now() - start) / 1000;
    const sorted = samples.map((s) => s.ms).sort((a, b) => a - b);
    const firsts = samples.filter((s) => s.seq === 0).map((s) => s.ms).sort((a, b) => a - b);
    const slow = samples.filter((s) => s.ms > 1000);
    return {
      clients: options.clients,
      sandboxes: options.sandboxes,
      seconds,
      execs: samples.length,
      errors,
      ...(firstError !== undefined ? { firstError } : {}),
      perSecond: samples.length / seconds,
      p50Ms: percentile(sorted, 50),
      p99Ms: percentile(sorted, 99),
      maxMs: sorted[sorted.length - 1] ?? Number.NaN,
      over1s: slow.length,
      over1sFirstOrSecond: slow.filter((s) => s.seq <= 1).length,
      slowest: [...samples].sort((a, b) => b.ms - a.ms).slice(0, 8).map((s) => ({ ...s, ms: Math.round(s.ms) })),
      firstP50Ms: percentile(firsts, 50),
      firstMaxMs: firsts[firsts.length - 1] ?? Number.NaN,
    };
  } finally {
    await Promise.all(sandboxes.map((s) => s.kill().catch(() => undefined)));
  }
}
