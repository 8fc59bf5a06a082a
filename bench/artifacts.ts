/**
 * Artifact collection throughput: `collectArtifacts()` from a live (frozen) sandbox into a fresh
 * LocalArtifactStore — O_NOFOLLOW reads, sha256 while streaming, fsync, re-read to verify,
 * rename, SQLite row — against a plain `cp -r` of the same directory to the same disk (and, for
 * reference, `cp -r` followed by `sync -f`, which pays for durability as the store does). Two
 * shapes: 1 × 100 MiB and 1,000 × 10 KiB (random bytes, so nothing deduplicates). Reports MiB/s
 * (median of the repetitions, alternating contenders) and the ratio capsule / cp.
 *
 *   node dist/bench/artifacts.js [--reps 3] [--json]
 */
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { chown, mkdir, mkdtemp, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { NamespaceBackend } from '../src/backends/namespace/namespace-backend.host.js';
import { collectArtifacts } from '../src/engine/artifacts.js';
import { newSandboxId } from '../src/engine/ids.js';
import { HostEnvironment } from '../src/host/host-env.host.js';
import { parseSpec } from '../src/sandbox-spec/index.js';
import { LocalArtifactStore } from '../src/store/artifacts/index.js';
import { percentile, table, timeIt } from './stats.js';

const MiB = 1024 * 1024;
/** The whole benchmark stops (and cleans up) after this, whatever the repetitions. */
const BUDGET_MS = 180_000;

interface Shape {
  name: string;
  files: number;
  bytesEach: number;
}

const SHAPES: Shape[] = [
  { name: '1 x 100 MiB', files: 1, bytesEach: 100 * MiB },
  { name: '1000 x 10 KiB', files: 1000, bytesEach: 10 * 1024 },
];

function spawnWait(file: string, args: string[]): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(file, args, { stdio: 'ignore' });
    child.once('error', reject);
    child.once('close', (code) => (code === 0 ? resolve() : reject(new Error(`${file} exited ${code}`))));
  });
}

async function writeShape(dir: string, shape: Shape, uid: number): Promise<void> {
  await mkdir(dir, { recursive: true });
  for (let i = 0; i < shape.files; i++) {
    const path = join(dir, `f${String(i).padStart(4, '0')}.bin`);
    await writeFile(path, randomBytes(shape.bytesEach));
    await chown(path, uid, uid);
  }
}

interface Row {
  shape: string;
  bytes: number;
  capsuleMiBps: number;
  cpMiBps: number;
  cpSyncMiBps: number;
  /** capsule throughput / cp throughput. */
  ratio: number;
  /** capsule throughput / (cp + sync) throughput. */
  ratioSync: number;
  reps: number;
}

async function main(): Promise<void> {
  const args = process.argv.slice(2);
  const repsArg = args.indexOf('--reps');
  const reps = Math.min(10, Math.max(1, Number(repsArg >= 0 ? args[repsArg + 1] : 3) || 3));
  const json = args.includes('--json');
  const deadline = Date.now() + BUDGET_MS;

  const dataDir = await mkdtemp(join(tmpdir(), 'capsule-bench-artifacts-'));
  const host = new HostEnvironment({ dataDir, volumeBytes: 2 * 1024 ** 3 });
  const backend = new NamespaceBackend({ host });
  const rows: Row[] = [];
  try {
    await host.ensure();
    const spec = parseSpec({ limits: { diskBytes: 1024 * MiB, wallClockMs: 600_000 } });
    const sandbox = await backend.create(spec, { id: newSandboxId() });
    try {
      const { uid } = await stat(sandbox.workspaceDir);
      for (const shape of SHAPES) {
        const sandboxDir = `/workspace/${shape.files}`;
        const hostDir = join(sandbox.workspaceDir, String(shape.files));
        await writeShape(hostDir, shape, uid);
        const bytes = shape.files * shape.bytesEach;
        const capsule: number[] = [];
        const cp: number[] = [];
        const cpSync: number[] = [];
        for (let rep = 0; rep < reps && Date.now() < deadline; rep++) {
          const storeRoot = join(dataDir, `store-${rep}-${shape.files}`);
          const store = await LocalArtifactStore.open({ root: storeRoot });
          // Each contender starts with no dirty pages of another's (or of the setup) to flush.
          await spawnWait('/usr/bin/sync', []);
          try {
            capsule.push(await timeIt(async () => {
              const c = await collectArtifacts(sandbox, store, { dir: sandboxDir, maxFileBytes: 128 * MiB, maxTotalBytes: 256 * MiB });
              if (c.deliveredBytes !== bytes) throw new Error(`collected ${c.deliveredBytes} of ${bytes} bytes: ${JSON.stringify(c.artifacts.slice(0, 3))}`);
            }));
          } finally {
            await store.close();
            await rm(storeRoot, { recursive: true, force: true });
          }
          const target = join(dataDir, `cp-${rep}-${shape.files}`);
          await spawnWait('/usr/bin/sync', []);
          cp.push(await timeIt(() => spawnWait('/usr/bin/cp', ['-r', hostDir, target])));
          await rm(target, { recursive: true, force: true });
          await spawnWait('/usr/bin/sync', []);
          cpSync.push(await timeIt(async () => {
            await spawnWait('/usr/bin/cp', ['-r', hostDir, target]);
            await spawnWait('/usr/bin/sync', ['-f', target]);
          }));
          await rm(target, { recursive: true, force: true });
        }
        const median = (s: number[]): number => percentile([...s].sort((a, b) => a - b), 50);
        const capsuleMiBps = bytes / MiB / (median(capsule) / 1000);
        const cpMiBps = bytes / MiB / (median(cp) / 1000);
        const cpSyncMiBps = bytes / MiB / (median(cpSync) / 1000);
        rows.push({
          shape: shape.name, bytes, capsuleMiBps, cpMiBps, cpSyncMiBps,
          ratio: capsuleMiBps / cpMiBps, ratioSync: capsuleMiBps / cpSyncMiBps, reps: capsule.length,
        });
      }
    } finally {
      await sandbox.destroy();
    }
  } finally {
    await backend.close();
    await host.volume.unmount();
    await rm(dataDir, { recursive: true, force: true });
  }

  if (json) {
    console.log(JSON.stringify({ benchmark: 'artifacts', reps, rows }, null, 2));
    return;
  }
  console.log(table(rows.map((r) => ({
    shape: r.shape,
    reps: r.reps,
    'capsule MiB/s': r.capsuleMiBps,
    'cp -r MiB/s': r.cpMiBps,
    'cp -r + sync MiB/s': r.cpSyncMiBps,
    'capsule / cp': `${r.ratio.toFixed(2)}x`,
    'capsule / (cp + sync)': `${r.ratioSync.toFixed(2)}x`,
  }))));
  console.log('\ncapsule: O_NOFOLLOW read + sha256 + fsync + re-read verify + rename + dir fsync + index row per file; cp -r: copy only.');
}

await main();
