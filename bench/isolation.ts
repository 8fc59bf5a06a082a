/**
 * One-shot execution cost: `run(['/bin/true'])` on a long-lived Runner (cold, and with a warm
 * pool of two sandboxes started ahead) and `capsule run -- /bin/true`, beside a plain spawn and
 * raw bubblewrap, in the same run and interleaved so that
 * the machine's noise hits every contender alike. Prints p50/p95 and ratios to raw bwrap.
 *
 *   node dist/bench/isolation.js [--n 30] [--json]
 */
import { spawn } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Runner } from '../src/engine/runner.js';
import { summarize, table, timeIt, type Summary } from './stats.js';

function spawnWait(file: string, args: string[]): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(file, args, { stdio: 'ignore' });
    child.once('error', reject);
    child.once('close', (code) => (code === 0 ? resolve() : reject(new Error(`${file} exited ${code}`))));
  });
}

const RAW_BWRAP = (ws: string): string[] => [
  '--unshare-all', '--die-with-parent', '--new-session', '--ro-bind', '/usr', '/usr',
  '--symlink', 'usr/bin', '/bin', '--symlink', 'usr/lib', '/lib', '--symlink', 'usr/lib64', '/lib64',
  '--proc', '/proc', '--dev', '/dev', '--tmpfs', '/tmp', '--bind', ws, '/workspace', '--cap-drop', 'ALL', '/bin/true',
];

async function main(): Promise<void> {
  const args = process.argv.slice(2);
  const n = Number(args[args.indexOf('--n') + 1] ?? 30) || 30;
  const json = args.includes('--json');
  const dataDir = await mkdtemp(join(tmpdir(), 'capsule-bench-'));
  const ws = await mkdtemp(join(tmpdir(), 'capsule-bench-ws-'));
  const runner = new Runner({ dataDir, volumeBytes: 4 * 1024 ** 3 });
  const warm = new Runner({ dataDir, volumeBytes: 4 * 1024 ** 3, warmPool: 2, deferTeardown: true });
  const cli = join(import.meta.dirname, '..', '..', 'bin', 'capsule.js');
  const contenders: Record<string, () => Promise<unknown>> = {
    'plain spawn /bin/true': () => spawnWait('/bin/true', []),
    'raw bwrap /bin/true': () => spawnWait('/usr/bin/bwrap', RAW_BWRAP(ws)),
    'capsule run() library': async () => {
      const r = await runner.run(['/bin/true']);
      if (r.outcome !== 'ok') throw new Error(`run failed: ${JSON.stringify(r)}`);
    },
    'capsule run() library, warm pool + deferred teardown': async () => {
      const r = await warm.run(['/bin/true']);
      if (r.outcome !== 'ok') throw new Error(`run failed: ${JSON.stringify(r)}`);
    },
    'capsule run CLI': () => spawnWait(process.execPath, [cli, 'run', '--data-dir', dataDir, '--', '/bin/true']),
  };
  const samples: Record<string, number[]> = Object.fromEntries(Object.keys(contenders).map((k) => [k, []]));
  try {
    for (const fn of Object.values(contenders)) await fn(); // warm-up: host prepared, caches hot
    for (let i = 0; i < n; i++) {
      for (const [name, fn] of Object.entries(contenders)) samples[name]!.push(await timeIt(fn));
    }
  } finally {
    await warm.close();
    await runner.close();
    await rm(dataDir, { recursive: true, force: true });
    await rm(ws, { recursive: true, force: true });
  }
  const summaries: Summary[] = Object.entries(samples).map(([name, s]) => summarize(name, s));
  const bwrap = summaries.find((s) => s.name === 'raw bwrap /bin/true')!;
  const rows = summaries.map((s) => ({
    contender: s.name,
    n: s.n,
    'p50 ms': s.p50Ms,
    'p95 ms': s.p95Ms,
    'p50 vs raw bwrap': `${(s.p50Ms / bwrap.p50Ms).toFixed(2)}x`,
  }));
  if (json) console.log(JSON.stringify({ benchmark: 'isolation', n, summaries }, null, 2));
  else {
    console.log(table(rows));
    for (const name of ['capsule run() library', 'capsule run() library, warm pool + deferred teardown']) {
      const lib = summaries.find((s) => s.name === name)!;
      console.log(`${name} / raw bwrap p50: ${(lib.p50Ms / bwrap.p50Ms).toFixed(2)}x (target <= 2.5x)`);
    }
  }
}

await main();
