/**
 * CLI start-up, each Capsule command paired with its peer and run interleaved (A B, then B A in
 * the next round) so that the machine's noise hits both alike:
 *
 *   capsule --version            vs  node -e 0        (bare node)         target <= 1.3x
 *   capsule run -- /bin/true     vs  srt /bin/true    (Anthropic's srt)   target <= 0.35x
 *   capsule run -- /bin/true     vs  bwrap /bin/true  (raw bubblewrap: the floor of any sandbox)
 *   capsule run -- /bin/true     vs  node bin/capsule.js run -- /bin/true  (the same run loaded
 *                                    module by module, without the startup snapshot)
 *
 * `capsule` is the package's command, bin/capsule: it starts `capsule run` from the CLI's startup
 * snapshot (docs/decisions/021) and every other command as `node bin/capsule.js`.
 *
 * srt comes from bench/peers (npm ci --prefix bench/peers; it needs Debian's ripgrep and socat,
 * which scripts/setup.sh installs). If it is missing or cannot run, the report says why and the
 * run is compared with raw bwrap only. Prints medians, p95, the ratio of the medians, and the mean
 * CPU time (user + system, children included) of each contender, which a loaded machine inflates
 * less than wall time.
 *
 *   node dist/bench/cli.js [--rounds 30] [--json] [--cli PATH]
 *
 * --cli measures another build's command (an older checkout's bin/capsule.js or bin/capsule, for a
 * before/after figure).
 */
import { spawn } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { HostEnvironment } from '../src/host/host-env.host.js';
import { summarize, table } from './stats.js';

const ROOT = join(import.meta.dirname, '..', '..');
const DEFAULT_CLI = join(ROOT, 'bin', 'capsule');
const MODULES_CLI = join(ROOT, 'bin', 'capsule.js');
const SRT = join(ROOT, 'bench', 'peers', 'node_modules', '.bin', 'srt');
/** Clock ticks per second of /proc's CPU times (USER_HZ: 100 on Linux). */
const TICKS_PER_SECOND = 100;

interface Contender {
  name: string;
  argv: string[];
}

interface Sample {
  wallMs: number;
  cpuMs: number;
}

/** CPU time of this process's reaped children (cutime + cstime of /proc/self/stat), in ms. */
function childrenCpuMs(): number {
  const stat = readFileSync('/proc/self/stat', 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  // After the command name: state is field 3, so cutime (16) and cstime (17) are at 13 and 14.
  return ((Number(fields[13]) + Number(fields[14])) * 1000) / TICKS_PER_SECOND;
}

/** Runs argv to the end; rejects with its stderr unless it exits 0. */
function runOnce(argv: string[]): Promise<Sample> {
  const [file, ...args] = argv as [string, ...string[]];
  const cpuBefore = childrenCpuMs();
  const started = performance.now();
  return new Promise((resolve, reject) => {
    const child = spawn(file, args, { stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    child.once('error', reject);
    child.once('close', (code) => {
      const wallMs = performance.now() - started;
      if (code !== 0) reject(new Error(`${argv.join(' ')} exited ${code}: ${stderr.trim()}`));
      else resolve({ wallMs, cpuMs: childrenCpuMs() - cpuBefore });
    });
  });
}

const RAW_BWRAP = [
  '/usr/bin/bwrap', '--unshare-all', '--die-with-parent', '--new-session', '--ro-bind', '/usr', '/usr',
  '--symlink', 'usr/bin', '/bin', '--symlink', 'usr/lib', '/lib', '--symlink', 'usr/lib64', '/lib64',
  '--proc', '/proc', '--dev', '/dev', '--tmpfs', '/tmp', '--cap-drop', 'ALL', '/bin/true',
];

/** Why srt cannot be a peer here, or undefined when it runs. */
async function srtProblem(): Promise<string | undefined> {
  if (!existsSync(SRT)) return `srt is not installed (run: npm ci --prefix bench/peers)`;
  try {
    await runOnce([SRT, '/bin/true']);
    return undefined;
  } catch (error) {
    return `srt /bin/true fails here: ${(error as Error).message}`;
  }
}

interface Pair {
  peer: Contender;
  capsule: Contender;
  target?: number;
}

async function main(): Promise<void> {
  const args = process.argv.slice(2);
  const rounds = Number(args[args.indexOf('--rounds') + 1] ?? 30) || 30;
  const json = args.includes('--json');
  const CLI = args.includes('--cli') ? (args[args.indexOf('--cli') + 1] ?? DEFAULT_CLI) : DEFAULT_CLI;
  const dataDir = await mkdtemp(join(tmpdir(), 'capsule-bench-cli-'));
  // A .js entry is started by this node; the command (bin/capsule) by itself, as a shell would.
  const command = (cli: string, ...rest: string[]): string[] => (cli.endsWith('.js') ? [process.execPath, cli, ...rest] : [cli, ...rest]);
  const runArgs = ['run', '--data-dir', dataDir, '--', '/bin/true'];
  const capsuleRun: Contender = { name: 'capsule run -- /bin/true', argv: command(CLI, ...runArgs) };
  const srtMissing = await srtProblem();
  const pairs: Pair[] = [
    { peer: { name: 'node -e 0', argv: [process.execPath, '-e', '0'] }, capsule: { name: 'capsule --version', argv: command(CLI, '--version') }, target: 1.3 },
    ...(srtMissing ? [] : [{ peer: { name: 'srt /bin/true', argv: [SRT, '/bin/true'] }, capsule: capsuleRun, target: 0.35 }]),
    { peer: { name: 'raw bwrap /bin/true', argv: RAW_BWRAP }, capsule: capsuleRun },
    { peer: { name: 'node bin/capsule.js run -- /bin/true', argv: command(MODULES_CLI, ...runArgs) }, capsule: capsuleRun },
  ];
  const samples = pairs.map(() => ({ peer: [] as Sample[], capsule: [] as Sample[] }));
  try {
    // Warm-up: the first `capsule run` makes and mounts the data dir's volume; caches get hot.
    for (const pair of pairs) for (const contender of [pair.peer, pair.capsule, pair.capsule]) await runOnce(contender.argv);
    for (let round = 0; round < rounds; round++) {
      for (const [i, pair] of pairs.entries()) {
        const order = round % 2 === 0 ? (['peer', 'capsule'] as const) : (['capsule', 'peer'] as const);
        for (const side of order) samples[i]![side].push(await runOnce(pair[side].argv));
      }
    }
  } finally {
    await new HostEnvironment({ dataDir }).volume.unmount();
    await rm(dataDir, { recursive: true, force: true });
  }

  const rows = pairs.map((pair, i) => {
    const peer = summarize(pair.peer.name, samples[i]!.peer.map((s) => s.wallMs));
    const ours = summarize(pair.capsule.name, samples[i]!.capsule.map((s) => s.wallMs));
    const cpu = (list: Sample[]): number => list.reduce((sum, s) => sum + s.cpuMs, 0) / list.length;
    const ratio = ours.p50Ms / peer.p50Ms;
    return {
      capsule: pair.capsule.name,
      peer: pair.peer.name,
      'capsule p50 ms': ours.p50Ms,
      'peer p50 ms': peer.p50Ms,
      'capsule p95 ms': ours.p95Ms,
      'peer p95 ms': peer.p95Ms,
      'ratio (p50)': ratio,
      target: pair.target === undefined ? '-' : `<= ${pair.target}`,
      'cpu ms capsule': cpu(samples[i]!.capsule),
      'cpu ms peer': cpu(samples[i]!.peer),
      'cpu ratio': cpu(samples[i]!.capsule) / cpu(samples[i]!.peer),
    };
  });
  if (json) {
    console.log(JSON.stringify({ rounds, srt: srtMissing ?? 'ok', rows }));
    return;
  }
  console.log(`CLI start-up, ${rounds} interleaved rounds per pair (node ${process.version})`);
  if (srtMissing) console.log(`srt not compared: ${srtMissing}`);
  console.log(table(rows));
}

await main();
