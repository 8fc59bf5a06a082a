/**
 * The same agent loop through two clients against one in-process `capsule serve` on loopback:
 * create a sandbox, run `echo hi`, kill it — through the official E2B SDK (e2b 2.51.0, the E2B
 * facade) and through Capsule's own SDK (the v1 API). Interleaved, so the machine's noise hits
 * both alike; p50/p95 side by side. The E2B SDK runs commands as `/bin/bash -l -c` (a login
 * shell, as E2B does), Capsule's SDK as `sh -c`: that difference is part of what is measured.
 *
 *   node dist/bench/e2b.js [--n 20] [--json]     (N is capped at 20)
 */
import { randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Sandbox as E2bSandbox } from 'e2b';
import { Sandbox } from '../src/sdk/index.js';
import { startServer } from '../src/server/bootstrap.js';
import { summarize, table, timeIt, type Summary } from './stats.js';

const MAX_N = 20;

function flag(args: string[], name: string, fallback: number): number {
  const at = args.indexOf(name);
  const value = at === -1 ? fallback : Number(args[at + 1]);
  if (!Number.isInteger(value) || value < 1) throw new Error(`${name} must be a positive integer`);
  return Math.min(value, MAX_N);
}

async function main(): Promise<void> {
  const args = process.argv.slice(2);
  const n = flag(args, '--n', MAX_N);
  const json = args.includes('--json');
  const dataDir = await mkdtemp(join(tmpdir(), 'capsule-bench-e2b-'));
  const apiKey = `cap_${randomBytes(20).toString('hex')}`;
  // Nothing may leave the machine: every E2B call gets loopback URLs, and the domain is unroutable.
  process.env.E2B_DOMAIN = 'capsule.invalid';
  const server = await startServer({ dataDir, port: 0, env: { CAPSULE_API_KEY: apiKey } });
  const e2bOpts = {
    apiKey: `e2b_${apiKey.slice(4)}`,
    apiUrl: server.url,
    sandboxUrl: server.url,
    domain: 'capsule.invalid',
    timeoutMs: 60_000,
  };
  const contenders: Record<string, () => Promise<void>> = {
    'E2B SDK → Capsule (E2B facade)': async () => {
      const sbx = await E2bSandbox.create(e2bOpts);
      const result = await sbx.commands.run('echo hi');
      if (result.stdout !== 'hi\n') throw new Error(`echo hi printed ${JSON.stringify(result.stdout)}`);
      await sbx.kill();
    },
    'Capsule SDK → Capsule (v1 API)': async () => {
      const sbx = await Sandbox.create({ ttlMs: 60_000 }, { url: server.url, apiKey });
      const result = await sbx.commands.run('echo hi');
      if (result.stdout !== 'hi\n') throw new Error(`echo hi printed ${JSON.stringify(result.stdout)}`);
      await sbx.kill();
    },
  };
  const samples: Record<string, number[]> = Object.fromEntries(Object.keys(contenders).map((k) => [k, []]));
  try {
    for (const fn of Object.values(contenders)) await fn(); // warm-up
    for (let i = 0; i < n; i++) {
      for (const [name, fn] of Object.entries(contenders)) samples[name]!.push(await timeIt(fn));
    }
  } finally {
    await server.close();
    await rm(dataDir, { recursive: true, force: true });
  }
  const summaries: Summary[] = Object.entries(samples).map(([name, s]) => summarize(name, s));
  const base = summaries[1]!.p50Ms;
  if (json) {
    process.stdout.write(`${JSON.stringify({ benchmark: 'e2b', loop: 'create + run("echo hi") + kill', n, results: summaries }, null, 2)}\n`);
    return;
  }
  process.stdout.write(`create + commands.run('echo hi') + kill, N=${n}, one in-process capsule serve on loopback\n\n`);
  process.stdout.write(
    `${table(summaries.map((s) => ({ client: s.name, 'p50 ms': s.p50Ms, 'p95 ms': s.p95Ms, 'min ms': s.minMs, 'p50 / Capsule SDK': s.p50Ms / base })))}\n`,
  );
}

main().catch((error: unknown) => {
  process.stderr.write(`bench/e2b: ${(error as Error).stack ?? String(error)}\n`);
  process.exitCode = 1;
});
