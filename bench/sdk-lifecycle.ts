/**
 * The SDK path end to end: a `capsule serve` started in-process on loopback, driven through the
 * TypeScript SDK over HTTP. Measures, in one run:
 *   - create + first exec(`echo hi`) + kill of a sandbox (N=30), beside raw bwrap /bin/true (same N,
 *     interleaved so the machine's noise hits both alike);
 *   - exec `echo hi` on an already-running sandbox (N=200), beside the engine's own exec (no HTTP)
 *     and an HTTP GET that does no work, to show where the time goes;
 *   - host memory per idle sandbox: the PSS (/proc/PID/smaps_rollup) of every process of 100 idle
 *     sandboxes (launcher, bwrap, agent), plus the server's RSS growth, divided by 100.
 * Targets: exec p50 ≤ 3 ms; create + first exec ≤ 5x raw bwrap; ≤ 2 MiB per idle sandbox.
 *
 *   node dist/bench/sdk-lifecycle.js [--n 30] [--exec-n 200] [--idle 100] [--json]
 */
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { HostEnvironment } from '../src/host/host-env.host.js';
import { Sandbox, type ConnectionOptions } from '../src/sdk/index.js';
import { startServer } from '../src/server/bootstrap.js';
import { descendants, pssBytes } from './proc.js';
import { summarize, table, timeIt, type Summary } from './stats.js';

const MiB = 1024 * 1024;
const RAW_BWRAP = [
  '--unshare-all', '--die-with-parent', '--new-session', '--ro-bind', '/usr', '/usr',
  '--symlink', 'usr/bin', '/bin', '--symlink', 'usr/lib', '/lib', '--symlink', 'usr/lib64', '/lib64',
  '--proc', '/proc', '--dev', '/dev', '--tmpfs', '/tmp', '--cap-drop', 'ALL', '/bin/true',
];

function spawnWait(file: string, args: string[]): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(file, args, { stdio: 'ignore' });
    child.once('error', reject);
    child.once('close', (code) => (code === 0 ? resolve() : reject(new Error(`${file} exited ${code}`))));
  });
}

/** A bounded integer flag. */
function flag(args: string[], name: string, fallback: number, max: number): number {
  const at = args.indexOf(name);
  const value = at === -1 ? fallback : Number(args[at + 1]);
  if (!Number.isInteger(value) || value < 1) throw new Error(`${name} must be a positive integer`);
  return Math.min(value, max);
}

async function echoHi(sandbox: Sandbox): Promise<void> {
  const result = await sandbox.commands.run(['echo', 'hi']);
  if (result.outcome !== 'ok' || result.stdout !== 'hi\n') throw new Error(`echo hi failed: ${JSON.stringify(result)}`);
}


async function rssBytes(): Promise<number> {
  (globalThis as { gc?: () => void }).gc?.();
  const status = await readFile('/proc/self/status', 'utf8');
  return Number(/^VmRSS:\s+(\d+) kB/m.exec(status)?.[1] ?? 0) * 1024;
}

interface IdleMemory {
  sandboxes: number;
  processes: number;
  pssPerSandboxBytes: number;
  serverRssGrowthPerSandboxBytes: number;
  totalPerSandboxBytes: number;
}

async function idleMemory(conn: ConnectionOptions, count: number): Promise<IdleMemory> {
  const before = await rssBytes();
  const sandboxes: Sandbox[] = [];
  try {
    // Idle sandboxes need little disk: 100 of the default 512 MiB would not fit the volume, which
    // is never promised more than it holds (docs/decisions/006).
    for (let i = 0; i < count; i++) sandboxes.push(await Sandbox.create({ ttlMs: 600_000, limits: { diskBytes: 64 * MiB } }, conn));
    const after = await rssBytes();
    const pids = await descendants(process.pid);
    let pss = 0;
    for (const pid of pids) pss += await pssBytes(pid);
    const pssPer = pss / count;
    const growthPer = Math.max(0, after - before) / count;
    return { sandboxes: count, processes: pids.length, pssPerSandboxBytes: pssPer, serverRssGrowthPerSandboxBytes: growthPer, totalPerSandboxBytes: pssPer + growthPer };
  } finally {
    for (const sandbox of sandboxes) await sandbox.kill().catch((error: unknown) => process.stderr.write(`kill ${sandbox.sandboxId}: ${String(error)}\n`));
  }
}

async function main(): Promise<void> {
  const args = process.argv.slice(2);
  const n = flag(args, '--n', 30, 100);
  const execN = flag(args, '--exec-n', 200, 2000);
  const idle = flag(args, '--idle', 100, 200);
  const json = args.includes('--json');

  const dataDir = await mkdtemp(join(tmpdir(), 'capsule-bench-sdk-'));
  const apiKey = `cap_${randomBytes(20).toString('hex')}`;
  const host = new HostEnvironment({ dataDir, volumeBytes: 4 * 1024 ** 3 });
  await host.ensure();
  const server = await startServer({ dataDir, port: 0, env: { CAPSULE_API_KEY: apiKey }, maxSandboxesPerTenant: idle + 10 });
  const conn: ConnectionOptions = { url: server.url, apiKey };
  // The same server with a warm pool of two sandboxes (its own data dir: one server per dir).
  const warmDir = await mkdtemp(join(tmpdir(), 'capsule-bench-sdk-warm-'));
  const warmServer = await startServer({ dataDir: warmDir, port: 0, env: { CAPSULE_API_KEY: apiKey }, warmPool: 2 });
  const warmConn: ConnectionOptions = { url: warmServer.url, apiKey };
  try {
    // Warm up both paths (first backend probe, page cache, HTTP keep-alive).
    const warm = await Sandbox.create(undefined, conn);
    await echoHi(warm);
    await warm.kill();
    await spawnWait('/usr/bin/bwrap', RAW_BWRAP);

    const createExec: number[] = [];
    const warmCreateExec: number[] = [];
    const lifecycle: number[] = [];
    const bwrap: number[] = [];
    for (let i = 0; i < n; i++) {
      const warmStart = performance.now();
      const pooled = await Sandbox.create(undefined, warmConn);
      await echoHi(pooled);
      warmCreateExec.push(performance.now() - warmStart);
      await pooled.kill();
      bwrap.push(await timeIt(() => spawnWait('/usr/bin/bwrap', RAW_BWRAP)));
      const start = performance.now();
      const sandbox = await Sandbox.create(undefined, conn);
      await echoHi(sandbox);
      createExec.push(performance.now() - start);
      await sandbox.kill();
      lifecycle.push(performance.now() - start);
    }

    // Exec on a running sandbox, interleaved with its parts: the engine alone (no HTTP) and an
    // HTTP round trip that does no work (GET), so the table shows where the time goes.
    const running = await Sandbox.create(undefined, conn);
    const exec: number[] = [];
    const engineExec: number[] = [];
    const httpGet: number[] = [];
    const engine = server.app.services.engine;
    const engineEchoHi = async () => {
      const handle = await engine.startProcess(running.info.tenantId, running.sandboxId, { argv: ['echo', 'hi'] });
      const result = await handle.result;
      if (result.stdout !== 'hi\n') throw new Error(`engine echo hi failed: ${JSON.stringify(result)}`);
    };
    try {
      for (let i = 0; i < 10; i++) await echoHi(running);
      for (let i = 0; i < execN; i++) {
        exec.push(await timeIt(() => echoHi(running)));
        engineExec.push(await timeIt(engineEchoHi));
        httpGet.push(await timeIt(() => running.getInfo()));
      }
    } finally {
      await running.kill();
    }

    const memory = await idleMemory(conn, idle);

    const rows: Summary[] = [
      summarize('raw bwrap /bin/true (spawned from Node)', bwrap),
      summarize('SDK create + first exec(echo hi)', createExec),
      summarize('SDK create + exec + kill', lifecycle),
      summarize('SDK create + first exec, server with a warm pool of 2', warmCreateExec),
      summarize('SDK exec(echo hi) on a running sandbox', exec),
      summarize('  of which: engine exec(echo hi), no HTTP', engineExec),
      summarize('  for scale: SDK getInfo (HTTP GET, no work)', httpGet),
    ];
    const [raw, firstExec, , warmFirstExec, execRunning] = rows as [Summary, Summary, Summary, Summary, Summary];
    const ratios = {
      createFirstExecVsBwrapP50: firstExec.p50Ms / raw.p50Ms,
      createFirstExecVsBwrapP95: firstExec.p95Ms / raw.p95Ms,
      warmCreateFirstExecVsBwrapP50: warmFirstExec.p50Ms / raw.p50Ms,
      execVsBwrapP50: execRunning.p50Ms / raw.p50Ms,
    };
    const targets = {
      execP50Ms: { target: 3, measured: execRunning.p50Ms, met: execRunning.p50Ms <= 3 },
      createFirstExecVsBwrap: { target: 5, measured: ratios.createFirstExecVsBwrapP50, met: ratios.createFirstExecVsBwrapP50 <= 5 },
      warmCreateFirstExecVsBwrap: { target: 5, measured: ratios.warmCreateFirstExecVsBwrapP50, met: ratios.warmCreateFirstExecVsBwrapP50 <= 5 },
      idleMemoryPerSandboxMiB: { target: 2, measured: memory.totalPerSandboxBytes / MiB, met: memory.totalPerSandboxBytes <= 2 * MiB },
    };
    if (json) {
      process.stdout.write(`${JSON.stringify({ n, execN, rows, ratios, memory, targets }, null, 2)}\n`);
      return;
    }
    const bwrapP50 = raw.p50Ms;
    process.stdout.write(
      `${table(rows.map((r) => ({ contender: r.name, n: r.n, 'p50 ms': r.p50Ms, 'p95 ms': r.p95Ms, 'min ms': r.minMs, 'x bwrap p50': r.p50Ms / bwrapP50 })))}\n\n`,
    );
    process.stdout.write(
      `${table([
        { measure: `idle sandboxes`, value: memory.sandboxes },
        { measure: 'their processes', value: memory.processes },
        { measure: 'PSS per sandbox (MiB)', value: memory.pssPerSandboxBytes / MiB },
        { measure: 'server RSS growth per sandbox (MiB)', value: memory.serverRssGrowthPerSandboxBytes / MiB },
        { measure: 'host memory per idle sandbox (MiB)', value: memory.totalPerSandboxBytes / MiB },
      ])}\n\n`,
    );
    process.stdout.write(
      `${table(Object.entries(targets).map(([name, t]) => ({ target: name, goal: `<= ${t.target}`, measured: t.measured, met: t.met ? 'yes' : 'NO' })))}\n`,
    );
  } finally {
    await warmServer.close();
    await rm(warmDir, { recursive: true, force: true });
    await server.close();
    await host.volume.unmount();
    await rm(dataDir, { recursive: true, force: true });
  }
}

await main();
