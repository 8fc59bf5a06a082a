/**
 * Snapshots and forks on the engine (namespace backend, host template, in-memory records):
 *
 *  - a filesystem snapshot of a running sandbox holding 200 MiB of changes (random bytes the
 *    sandbox wrote itself): freeze, read-only btrfs snapshot, thaw, quota read, record (target
 *    p50 <= 30 ms);
 *  - create from that snapshot vs create from the template, alternating (target <= 1.2x);
 *  - fork x10 (one snapshot, ten creates) vs one create (target <= 10x);
 *  - gVisor: a fork from a full snapshot (processes and memory) vs `runsc restore` alone of the
 *    same image (target <= 1.3x; bench/snapshots-gvisor.ts), unless --no-gvisor or no runsc.
 *
 *   node dist/bench/snapshots.js [--reps 15] [--no-gvisor] [--json]
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { SandboxManager } from '../src/engine/sandbox-manager.js';
import { HostEnvironment } from '../src/host/host-env.host.js';
import { existsSync } from 'node:fs';
import { summarize, table, timeIt } from './stats.js';
import { measureFullFork } from './snapshots-gvisor.js';

const MiB = 1024 * 1024;
const TENANT = 'bench';

async function main(): Promise<void> {
  const args = process.argv.slice(2);
  const json = args.includes('--json');
  const repsIndex = args.indexOf('--reps');
  const reps = repsIndex >= 0 ? Number(args[repsIndex + 1]) : 15;
  const dataDir = await mkdtemp(join(tmpdir(), 'capsule-bench-snapshots-'));
  const host = new HostEnvironment({ dataDir, volumeBytes: 8 * 1024 ** 3 });
  const engine = await SandboxManager.open({ dataDir, host });
  const spec = { ttlMs: 600_000, limits: { diskBytes: 1024 * MiB, wallClockMs: 600_000 } };
  const rows: Record<string, string | number>[] = [];
  try {
    const source = await engine.create({ tenantId: TENANT, spec });
    const wrote = await (await engine.startProcess(TENANT, source.sandboxId, {
      argv: ['/bin/sh', '-c', 'for i in 1 2 3 4; do head -c 52428800 /dev/urandom > /workspace/blob-$i; done; sync'],
      timeoutMs: 300_000,
    })).result;
    if (wrote.exitCode !== 0) throw new Error(`writing 200 MiB failed: ${wrote.stderr}`);
    // A process keeps running through every snapshot (it only sees a pause).
    await engine.startProcess(TENANT, source.sandboxId, { argv: ['/bin/sh', '-c', 'while :; do echo x >> /workspace/log; sleep 0.01; done'] });

    const snapshotMs: number[] = [];
    for (let i = 0; i < reps; i++) {
      let id = '';
      snapshotMs.push(await timeIt(async () => (id = (await engine.snapshot(TENANT, source.sandboxId)).snapshotId)));
      await engine.deleteSnapshot(TENANT, id);
    }
    const snap = summarize('snapshot of a sandbox with 200 MiB written', snapshotMs);
    rows.push({ measure: snap.name, n: snap.n, p50Ms: snap.p50Ms, p95Ms: snap.p95Ms, target: 'p50 <= 30 ms' });

    const snapshot = await engine.snapshot(TENANT, source.sandboxId);
    const fromTemplate: number[] = [];
    const fromSnapshot: number[] = [];
    for (let i = 0; i < reps; i++) {
      for (const [samples, input] of [[fromTemplate, spec], [fromSnapshot, { ...spec, snapshot: snapshot.snapshotId }]] as const) {
        let id = '';
        samples.push(await timeIt(async () => (id = (await engine.create({ tenantId: TENANT, spec: input })).sandboxId)));
        await engine.kill(TENANT, id);
      }
    }
    const template = summarize('create from the template', fromTemplate);
    const fromSnap = summarize('create from the snapshot (200 MiB)', fromSnapshot);
    rows.push({ measure: template.name, n: template.n, p50Ms: template.p50Ms, p95Ms: template.p95Ms, target: '' });
    // Each pair ran back to back under the same load: less swayed by other jobs on a shared machine.
    const pairs = summarize('pairs', fromSnapshot.map((ms, i) => ms / fromTemplate[i]!)).p50Ms;
    rows.push({ measure: fromSnap.name, n: fromSnap.n, p50Ms: fromSnap.p50Ms, p95Ms: fromSnap.p95Ms, target: `${(fromSnap.p50Ms / template.p50Ms).toFixed(2)}x of template, pairs ${pairs.toFixed(2)}x (<= 1.2x)` });

    const forkMs: number[] = [];
    for (let i = 0; i < Math.max(1, Math.floor(reps / 5)); i++) {
      let made: string[] = [];
      let taken = '';
      forkMs.push(
        await timeIt(async () => {
          const result = await engine.fork(TENANT, source.sandboxId, { count: 10 });
          taken = result.snapshot.snapshotId;
          made = result.forks.map((f) => {
            if (!('sandbox' in f)) throw new Error(`a fork failed: ${f.error.message}`);
            return f.sandbox.sandboxId;
          });
        }),
      );
      for (const id of made) await engine.kill(TENANT, id);
      await engine.deleteSnapshot(TENANT, taken);
    }
    const fork = summarize('fork x10', forkMs);
    rows.push({ measure: fork.name, n: fork.n, p50Ms: fork.p50Ms, p95Ms: fork.p95Ms, target: `${(fork.p50Ms / template.p50Ms).toFixed(2)}x one create (<= 10x)` });
    await engine.kill(TENANT, source.sandboxId);
    await engine.deleteSnapshot(TENANT, snapshot.snapshotId);

    if (!args.includes('--no-gvisor') && (existsSync('/usr/bin/runsc') || existsSync('/usr/local/bin/runsc'))) {
      const full = await measureFullFork(engine, dataDir, TENANT, Math.max(3, Math.floor(reps / 2)));
      rows.push({ measure: full.restore.name, n: full.restore.n, p50Ms: full.restore.p50Ms, p95Ms: full.restore.p95Ms, target: `image ${full.imageMiB.toFixed(1)} MiB` });
      rows.push({
        measure: full.fork.name, n: full.fork.n, p50Ms: full.fork.p50Ms, p95Ms: full.fork.p95Ms,
        target: `${(full.fork.p50Ms / full.restore.p50Ms).toFixed(2)}x restore, pairs ${full.pairedRatioP50.toFixed(2)}x (<= 1.3x)`,
      });
    }
  } finally {
    await engine.close();
    await host.volume.unmount();
    await rm(dataDir, { recursive: true, force: true });
  }
  if (json) console.log(JSON.stringify({ benchmark: 'snapshots', reps, rows }, null, 2));
  else console.log(table(rows));
}

await main();
