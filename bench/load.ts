/**
 * Capsule under load (issue 16), against a `capsule serve` of its own (a child process, as in
 * production) driven by the TypeScript SDK from this process:
 *   - creates: fill to --live sandboxes with --create-clients at once, then churn at that level
 *     for --churn-s (each client creates one, kills its oldest): creates/s with many live;
 *   - density: --idle idle sandboxes; host memory (MemAvailable) given up per sandbox;
 *   - exec: --exec-clients clients running commands.run(['true']) over --exec-sandboxes for
 *     --exec-s: errors, p50/p99/max, and where the slow requests fall;
 *   - cold: create + first exec with no warm pool against raw bwrap /bin/true, --cold-n pairs.
 * The creates and density phases run their peer right after (load-peer.ts: the same namespaces
 * and cgroups from bwrap and cgroupfs directly, no server) at the same counts; --no-peer skips it.
 * Every phase is bounded in count and time; --max-minutes ends the whole run. Targets: ≥ 100
 * creates/s with 1,000 live; 2,000 idle at ≤ 1 MiB each; 200 execs for 60 s with no error,
 * p99 ≤ 1 s, max ≤ 2 s; cold create + first exec ≤ 3× raw bwrap.
 *
 *   node dist/bench/load.js [--only creates,density,exec,cold] [--live 1000] [--create-clients 16]
 *     [--churn-s 20] [--idle 2000] [--exec-clients 200] [--exec-sandboxes 50] [--exec-s 60]
 *     [--cold-n 20] [--max-minutes 30] [--no-peer] [--json]
 */
import { spawn } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { cpus, loadavg, release, totalmem } from 'node:os';
import { Sandbox, type ConnectionOptions } from '../src/sdk/index.js';
import { createRates, idleDensity, type CreateRates, type IdleDensity } from './load-fleet.js';
import { execLoad, type ExecLoadResult } from './load-exec.js';
import { peerCreateRates, peerIdleDensity, type PeerCreateRates, type PeerDensity } from './load-peer.js';
import { startBenchServer, type BenchServer } from './load-server.js';
import { percentile, table } from './stats.js';

const MiB = 1024 * 1024;
const PHASES = ['creates', 'density', 'exec', 'cold'] as const;
type Phase = (typeof PHASES)[number];
const RAW_BWRAP = [
  '--unshare-all', '--die-with-parent', '--new-session', '--ro-bind', '/usr', '/usr',
  '--symlink', 'usr/bin', '/bin', '--symlink', 'usr/lib', '/lib', '--symlink', 'usr/lib64', '/lib64',
  '--proc', '/proc', '--dev', '/dev', '--tmpfs', '/tmp', '--cap-drop', 'ALL', '/bin/true',
];

/** A bounded integer flag. */
function flag(args: string[], name: string, fallback: number, max: number): number {
  const at = args.indexOf(name);
  const value = at === -1 ? fallback : Number(args[at + 1]);
  if (!Number.isInteger(value) || value < 1 || value > max) throw new Error(`${name} must be a whole number from 1 to ${max}`);
  return value;
}

function spawnWait(file: string, args: string[]): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(file, args, { stdio: 'ignore' });
    child.once('error', reject);
    child.once('close', (code) => (code === 0 ? resolve() : reject(new Error(`${file} exited ${code}`))));
  });
}

interface ColdResult {
  n: number;
  bwrapP50Ms: number;
  createFirstExecP50Ms: number;
  ratioP50: number;
  ratioMedianOfPairs: number;
}

/** Create + first exec on a server with no warm pool, interleaved with raw bwrap runs. */
async function coldCreate(conn: ConnectionOptions, n: number, spec: Record<string, unknown>): Promise<ColdResult> {
  // Warm the paths once (page cache, the first backend probe, a kept-alive connection).
  await spawnWait('/usr/bin/bwrap', RAW_BWRAP);
  const warm = await Sandbox.create(spec, conn);
  await warm.commands.run(['true']);
  await warm.kill();
  const bwrap: number[] = [];
  const sdk: number[] = [];
  for (let i = 0; i < n; i++) {
    let t0 = performance.now();
    await spawnWait('/usr/bin/bwrap', RAW_BWRAP);
    bwrap.push(performance.now() - t0);
    t0 = performance.now();
    const sandbox = await Sandbox.create(spec, conn);
    const result = await sandbox.commands.run(['true']);
    sdk.push(performance.now() - t0);
    await sandbox.kill();
    if (result.exitCode !== 0) throw new Error(`first exec exited ${result.exitCode}`);
  }
  const p50 = (xs: number[]) => percentile([...xs].sort((a, b) => a - b), 50);
  return {
    n,
    bwrapP50Ms: p50(bwrap),
    createFirstExecP50Ms: p50(sdk),
    ratioP50: p50(sdk) / p50(bwrap),
    ratioMedianOfPairs: p50(sdk.map((ms, i) => ms / bwrap[i]!)),
  };
}

async function machine(): Promise<string> {
  const model = cpus()[0]?.model.trim() ?? 'unknown CPU';
  const node = process.version;
  return `${cpus().length} × ${model}, ${(totalmem() / 1024 ** 3).toFixed(0)} GiB, Linux ${release()}, Node ${node}, pid_max ${(await readFile('/proc/sys/kernel/pid_max', 'utf8')).trim()}`;
}

const load = () => loadavg().map((l) => l.toFixed(2)).join(' ');

async function main(): Promise<void> {
  const args = process.argv.slice(2);
  const only = args.includes('--only') ? (args[args.indexOf('--only') + 1] ?? '').split(',') : [...PHASES];
  for (const phase of only) if (!PHASES.includes(phase as Phase)) throw new Error(`--only: unknown phase ${phase} (${PHASES.join(', ')})`);
  const live = flag(args, '--live', 1000, 5000);
  const createClients = flag(args, '--create-clients', 16, 256);
  const churnS = flag(args, '--churn-s', 20, 600);
  const idle = flag(args, '--idle', 2000, 5000);
  const execClients = flag(args, '--exec-clients', 200, 2000);
  const execSandboxes = flag(args, '--exec-sandboxes', 50, 1000);
  const execS = flag(args, '--exec-s', 60, 600);
  const coldN = flag(args, '--cold-n', 20, 200);
  const maxMinutes = flag(args, '--max-minutes', 30, 240);
  const json = args.includes('--json');
  const peer = !args.includes('--no-peer');

  // Small limits, overcommitted on purpose: the bench measures the server, not admission
  // (which would refuse 1,000 sandboxes of 512 MiB on 24 GiB, as it should).
  const spec = { limits: { memoryBytes: 32 * MiB, pids: 8, diskBytes: 4 * MiB } };
  const most = Math.max(live + createClients, idle, execSandboxes) + 16;
  const flags = ['--warm-pool', '0', '--max-sandboxes', String(most), '--max-live-sandboxes', String(most), '--memory-overcommit', '8', '--disk-overcommit', '4'];
  const stderr: string[] = [];
  const server: BenchServer = await startBenchServer(flags, { stderr: (line) => void (stderr.length < 50 && stderr.push(line)) });
  const watchdog = setTimeout(() => {
    process.stderr.write(`load: --max-minutes ${maxMinutes} reached; stopping\n`);
    void server
      .stop(10_000)
      .then(() => server.remove())
      .finally(() => process.exit(2));
  }, maxMinutes * 60_000);
  watchdog.unref();
  const conn: ConnectionOptions = { url: server.url, apiKey: server.apiKey };
  const loadAtStart = load();
  const out: { creates?: CreateRates; peerCreates?: PeerCreateRates; density?: IdleDensity; peerDensity?: PeerDensity; exec?: ExecLoadResult; cold?: ColdResult } = {};
  const peerLimits = { memoryBytes: spec.limits.memoryBytes, pids: spec.limits.pids, cpus: 1 };
  try {
    if (only.includes('cold')) out.cold = await coldCreate(conn, coldN, spec);
    if (only.includes('creates')) {
      out.creates = await createRates(conn, live, churnS * 1000, { clients: createClients, spec });
      if (peer) out.peerCreates = await peerCreateRates(live, churnS * 1000, createClients, peerLimits);
    }
    if (only.includes('density')) {
      out.density = await idleDensity(conn, idle, server.pid, () => server.rssBytes(), { clients: createClients, spec });
      if (peer) out.peerDensity = await peerIdleDensity(idle, createClients, peerLimits, [server.pid]);
    }
    if (only.includes('exec')) out.exec = await execLoad(conn, { clients: execClients, sandboxes: execSandboxes, durationMs: execS * 1000, spec });
  } finally {
    clearTimeout(watchdog);
    await server.stop();
    await server.remove();
  }
  const report = { machine: await machine(), loadAverageAtStart: loadAtStart, loadAverageAtEnd: load(), command: `node dist/bench/load.js ${args.join(' ')}`.trim(), ...out };
  if (json) {
    process.stdout.write(`${JSON.stringify(report, null, 2)}\n`);
    return;
  }
  const rows: Record<string, string | number>[] = [];
  const row = (measure: string, value: string, target: string, met: boolean | undefined) => rows.push({ measure, value, target, met: met === undefined ? '' : met ? 'yes' : 'NO' });
  if (out.creates) {
    const c = out.creates;
    row(`creates/s, churn at ${c.live} live (${c.clients} clients, ${c.churnSeconds.toFixed(0)} s)`, c.churnPerSecond.toFixed(1), '≥ 100', c.churnPerSecond >= 100);
    row(`creates/s, fill 0 → ${c.live}`, c.fillPerSecond.toFixed(1), '', undefined);
    row(`creates/s, last fifth of the fill`, c.fillLastFifthPerSecond.toFixed(1), '', undefined);
    row('create p50 / p99 ms', `${c.createP50Ms.toFixed(0)} / ${c.createP99Ms.toFixed(0)}`, '', undefined);
    row('kill in the churn p50 / p99 ms', `${c.killP50Ms.toFixed(0)} / ${c.killP99Ms.toFixed(0)}`, '', undefined);
    row('create errors', String(c.errors), '0', c.errors === 0);
    const p = out.peerCreates;
    if (p) {
      row(`  peer (raw bwrap + cgroups): churn at ${p.live} live, creates/s`, `${p.churnPerSecond.toFixed(1)} (Capsule ${(c.churnPerSecond / p.churnPerSecond).toFixed(2)}× of it)`, '', undefined);
      row(`  peer: fill 0 → ${p.live}, creates/s`, `${p.fillPerSecond.toFixed(1)} (Capsule ${(c.fillPerSecond / p.fillPerSecond).toFixed(2)}×)`, '', undefined);
      row('  peer errors', String(p.errors), '0', p.errors === 0);
    }
  }
  if (out.density) {
    const d = out.density;
    row(`host MiB per idle sandbox (MemAvailable, ${d.sandboxes})`, d.hostMiBPerSandbox.toFixed(2), '≤ 1', d.hostMiBPerSandbox <= 1 && d.sandboxes >= idle);
    row('  PSS of its processes, MiB', d.pssMiBPerSandbox.toFixed(2), '', undefined);
    row('  server RSS growth, MiB', d.serverMiBPerSandbox.toFixed(2), '', undefined);
    for (const [field, mib] of Object.entries(d.kernelMiBPerSandbox)) row(`  kernel ${field}, MiB`, mib.toFixed(2), '', undefined);
    const p = out.peerDensity;
    if (p) {
      row(`  peer (raw bwrap + cgroups): host MiB per idle sandbox (${p.sandboxes})`, `${p.hostMiBPerSandbox.toFixed(2)} (Capsule ${(d.hostMiBPerSandbox / p.hostMiBPerSandbox).toFixed(2)}×)`, '', undefined);
      row('  peer: PSS of its processes, MiB', p.pssMiBPerSandbox.toFixed(2), '', undefined);
      for (const [field, mib] of Object.entries(p.kernelMiBPerSandbox)) row(`  peer: kernel ${field}, MiB`, mib.toFixed(2), '', undefined);
      row('  peer errors', String(p.errors), '0', p.errors === 0);
    }
  }
  if (out.exec) {
    const e = out.exec;
    row(`execs/s (${e.clients} clients, ${e.sandboxes} sandboxes, ${e.seconds.toFixed(0)} s)`, e.perSecond.toFixed(0), '', undefined);
    row('exec errors', String(e.errors), '0', e.errors === 0);
    row('exec p50 / p99 ms', `${e.p50Ms.toFixed(0)} / ${e.p99Ms.toFixed(0)}`, 'p99 ≤ 1000', e.p99Ms <= 1000);
    row('exec max ms', e.maxMs.toFixed(0), '≤ 2000', e.maxMs <= 2000);
    row('  requests over 1 s (of them first or second of a client)', `${e.over1s} (${e.over1sFirstOrSecond})`, '', undefined);
  }
  if (out.cold) {
    const c = out.cold;
    row(`cold create + first exec / raw bwrap, p50 (n ${c.n})`, `${c.ratioP50.toFixed(2)}× (${c.createFirstExecP50Ms.toFixed(1)} / ${c.bwrapP50Ms.toFixed(1)} ms)`, '≤ 3×', c.ratioP50 <= 3);
    row('  median of paired ratios', `${c.ratioMedianOfPairs.toFixed(2)}×`, '', undefined);
  }
  process.stdout.write(`${report.machine}\nload average ${report.loadAverageAtStart} at start, ${report.loadAverageAtEnd} at end\n${report.command}\n\n${table(rows)}\n`);
  if (out.exec && out.exec.firstError) process.stdout.write(`first exec error: ${out.exec.firstError}\n`);
  if (out.creates?.firstError) process.stdout.write(`first create error: ${out.creates.firstError}\n`);
  if (out.density?.firstError) process.stdout.write(`first density error: ${out.density.firstError}\n`);
  if (out.peerCreates?.firstError) process.stdout.write(`first peer create error: ${out.peerCreates.firstError}\n`);
  if (out.peerDensity?.firstError) process.stdout.write(`first peer density error: ${out.peerDensity.firstError}\n`);
  if (out.exec) process.stdout.write(`slowest execs (client, seq, ms): ${out.exec.slowest.map((s) => `${s.client}/${s.seq}/${s.ms}`).join(' ')}\n`);
}

await main();
