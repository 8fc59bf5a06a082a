/**
 * gVisor `full` fork vs `runsc restore` alone (bench/snapshots.ts runs it): one create from a full
 * snapshot of a sandbox whose Python process holds `heldBytes` (the disk clone, cgroups, bundle,
 * `runsc restore` through the launcher, the agent's answer, the processes taken over), against a
 * bare `runsc restore --detach` of the very same image into a copy of that sandbox's bundle, with
 * the same runsc flags, in alternating order. Target: <= 1.3x.
 */
import { spawn } from 'node:child_process';
import { mkdir, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { buildRunscFlags, type OciSpec } from '../src/backends/gvisor/oci-bundle.js';
import { probeRunsc, writeRootfs } from '../src/backends/gvisor/runsc.host.js';
import type { SandboxManager } from '../src/engine/sandbox-manager.js';
import { summarize, timeIt, type Summary } from './stats.js';

const MiB = 1024 * 1024;

/**
 * Runs a runsc command. stdin and stdout are socket pairs (what Node's pipes are): the image's
 * agent had sockets as its stdio, and runsc restores them only onto sockets.
 */
function run(file: string, args: string[]): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(file, args, { stdio: ['pipe', 'pipe', 'pipe'] });
    child.stdout.resume();
    let stderr = '';
    child.stderr.on('data', (chunk: Buffer) => (stderr = (stderr + chunk.toString()).slice(0, 2000)));
    child.once('error', reject);
    child.once('close', (code) => (code === 0 ? resolve() : reject(new Error(`${file} ${args.slice(-4).join(' ')} exited ${code}: ${stderr.trim()}`))));
  });
}

export interface FullForkResult {
  fork: Summary;
  restore: Summary;
  imageMiB: number;
  /** Median of each back-to-back pair's ratio (less swayed by other jobs on a shared machine). */
  pairedRatioP50: number;
}

export async function measureFullFork(engine: SandboxManager, dataDir: string, tenantId: string, reps: number, heldBytes = 50 * MiB): Promise<FullForkResult> {
  const spec = { backend: 'gvisor' as const, ttlMs: 600_000, limits: { memoryBytes: heldBytes + 512 * MiB, wallClockMs: 600_000 } };
  const source = await engine.create({ tenantId, spec });
  const info = await probeRunsc();
  const rawRoot = join(dataDir, 'raw-runsc');
  const rawFlags = buildRunscFlags({ rootDir: rawRoot, platform: info.platform, network: 'none' });
  try {
    const code = `import time\nb = bytearray(${heldBytes})\nfor i in range(0, ${heldBytes}, 4096): b[i] = 1\nprint("ready", flush=True)\nwhile True: time.sleep(3600)`;
    const holder = await engine.startProcess(tenantId, source.sandboxId, { argv: ['python3', '-c', code] });
    for await (const event of holder.events()) if (event.type === 'stdout' && event.data.toString().includes('ready')) break;
    const snapshot = await engine.snapshot(tenantId, source.sandboxId, { mode: 'full' });
    const checkpoint = join(dataDir, 'volume', 'snapshots', snapshot.snapshotId, 'checkpoint');
    let imageBytes = 0;
    for (const name of await readdir(join(checkpoint, 'image'))) imageBytes += (await stat(join(checkpoint, 'image', name))).size;
    const imageMiB = imageBytes / MiB;

    // A fork's bundle, copied for raw runsc: the same mounts at the same paths, a workspace of its own.
    const sample = await engine.create({ tenantId, spec: { snapshot: snapshot.snapshotId } });
    const oci = JSON.parse(await readFile(join(dataDir, 'gvisor', 'bundles', sample.sandboxId, 'config.json'), 'utf8')) as OciSpec;
    await engine.kill(tenantId, sample.sandboxId);
    await mkdir(rawRoot, { recursive: true, mode: 0o700 });
    const rawBundle = async (index: number): Promise<string> => {
      const dir = join(dataDir, 'raw-full', String(index));
      const workspace = join(dir, 'workspace');
      await mkdir(workspace, { recursive: true });
      await writeRootfs(join(dir, 'rootfs'), []);
      const copy: OciSpec = {
        ...oci,
        root: { ...oci.root, path: join(dir, 'rootfs') },
        mounts: oci.mounts.map((m) => (m.destination === '/workspace' ? { ...m, source: workspace } : m)),
        linux: { ...oci.linux, cgroupsPath: `/capsule-bench-raw-full-${process.pid}-${index}` },
      };
      await writeFile(join(dir, 'config.json'), JSON.stringify(copy));
      return dir;
    };

    const forks: number[] = [];
    const restores: number[] = [];
    for (let i = -1; i < reps; i++) {
      const bundle = await rawBundle(i + 1);
      const id = `raw-full-${i + 1}`;
      const raw = async (): Promise<number> => {
        const ms = await timeIt(() => run(info.binary, [...rawFlags, 'restore', '--detach', `--image-path=${join(checkpoint, 'image')}`, '--bundle', bundle, id]));
        await run(info.binary, [...rawFlags, 'delete', '--force', id]);
        return ms;
      };
      const fork = async (): Promise<number> => {
        let made = '';
        const ms = await timeIt(async () => (made = (await engine.create({ tenantId, spec: { snapshot: snapshot.snapshotId } })).sandboxId));
        await engine.kill(tenantId, made);
        return ms;
      };
      // i = -1 warms both; the order alternates so neither always follows the other's teardown.
      const rawFirst = i % 2 === 0 ? await raw() : undefined;
      const forked = await fork();
      const restored = rawFirst ?? (await raw());
      await rm(bundle, { recursive: true, force: true });
      if (i < 0) continue;
      forks.push(forked);
      restores.push(restored);
    }
    await engine.kill(tenantId, source.sandboxId);
    await engine.deleteSnapshot(tenantId, snapshot.snapshotId);
    return {
      fork: summarize(`gvisor full fork x1 (create from a full snapshot, ${heldBytes / MiB} MiB held)`, forks),
      restore: summarize('runsc restore --detach alone (same image)', restores),
      imageMiB,
      pairedRatioP50: summarize('pairs', forks.map((ms, i) => ms / restores[i]!)).p50Ms,
    };
  } finally {
    await engine.kill(tenantId, source.sandboxId).catch(() => undefined);
  }
}
