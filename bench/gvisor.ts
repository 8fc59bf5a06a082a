/**
 * gVisor backend costs, beside its peers on the same machine and in the same run:
 *
 *  - create + first exec: `GvisorBackend.create()` then `exec(['/bin/true'])` to its exit, against
 *    a raw `runsc run` of the same OCI bundle with `/bin/true` as the container's process (start,
 *    run, exit), with the same runsc flags, interleaved in alternating order. Target: capsule ≤
 *    1.3 × raw runsc.
 *  - pause and resume with memory for a sandbox whose Python process holds 50 MiB and 500 MiB:
 *    gVisor checkpoint to disk / restore (until the agent answers), beside the namespace
 *    backend's cgroup freeze / thaw of the same workload.
 *
 *   node dist/bench/gvisor.js [--n 10] [--pause-n 5] [--json]
 */
import { spawn } from 'node:child_process';
import { chown, mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Backend, BackendSandbox } from '../src/backends/backend.js';
import { GvisorBackend } from '../src/backends/gvisor/gvisor-backend.host.js';
import { buildRunscFlags, type OciSpec } from '../src/backends/gvisor/oci-bundle.js';
import { probeRunsc, writeRootfs } from '../src/backends/gvisor/runsc.host.js';
import { NamespaceBackend } from '../src/backends/namespace/namespace-backend.host.js';
import { baseEnv } from '../src/host/sandbox-layout.js';
import { HostEnvironment } from '../src/host/host-env.host.js';
import { parseSpec } from '../src/sandbox-spec/index.js';
import { summarize, table, timeIt, type Summary } from './stats.js';

const MiB = 1024 * 1024;

function spawnWait(file: string, args: string[]): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(file, args, { stdio: 'ignore' });
    child.once('error', reject);
    child.once('close', (code) => (code === 0 ? resolve() : reject(new Error(`${file} ${args.slice(-3).join(' ')} exited ${code}`))));
  });
}

async function execToExit(sandbox: BackendSandbox, argv: string[]): Promise<void> {
  const proc = await sandbox.exec({ argv, env: baseEnv(), cwd: '/workspace' });
  const exit = await proc.exited;
  if (exit.exitCode !== 0) throw new Error(`${argv.join(' ')} failed: ${JSON.stringify(exit)}`);
}

/** Starts a Python process holding `bytes` of random memory; resolves once it is all touched. */
async function holdMemory(sandbox: BackendSandbox, bytes: number): Promise<void> {
  // Filled a MiB at a time: bytearray(os.urandom(n)) would briefly hold the bytes twice.
  const code = [
    'import os, time',
    `b = bytearray(${bytes})`,
    `for i in range(0, ${bytes}, 1 << 20): b[i:i + (1 << 20)] = os.urandom(1 << 20)`,
    'print("ready", flush=True)',
    'while True: time.sleep(3600)',
  ].join('\n');
  const proc = await sandbox.exec({ argv: ['python3', '-c', code], env: baseEnv(), cwd: '/workspace' });
  await new Promise<void>((resolve, reject) => {
    proc.onStdout((chunk) => {
      if (chunk.toString().includes('ready')) resolve();
    });
    void proc.exited.then((exit) => reject(new Error(`memory holder exited: ${JSON.stringify(exit)}`)));
  });
}

async function dirBytes(dir: string): Promise<number> {
  let total = 0;
  for (const name of await readdir(dir).catch(() => [] as string[])) total += (await stat(join(dir, name))).size;
  return total;
}

interface PauseRow {
  backend: string;
  heldMiB: number;
  pause: Summary;
  resume: Summary;
  imageMiB: number | null;
}

async function measurePause(backend: Backend, heldBytes: number, n: number, dataDir: string): Promise<PauseRow> {
  const spec = parseSpec({ backend: backend.name, limits: { memoryBytes: heldBytes + 512 * MiB, wallClockMs: 600_000 } });
  const sandbox = await backend.create(spec, { id: `bench-pause-${backend.name}-${heldBytes / MiB}` });
  const pauses: number[] = [];
  const resumes: number[] = [];
  let imageMiB: number | null = null;
  try {
    await holdMemory(sandbox, heldBytes);
    for (let i = 0; i < n; i++) {
      pauses.push(await timeIt(() => sandbox.pause!({ keepMemory: true })));
      if (backend.name === 'gvisor') imageMiB = (await dirBytes(join(dataDir, 'checkpoints', sandbox.id, 'image'))) / MiB;
      resumes.push(await timeIt(() => sandbox.resume!()));
    }
    await execToExit(sandbox, ['true']); // still alive and answering after the last resume
  } finally {
    await sandbox.destroy();
  }
  return { backend: backend.name, heldMiB: heldBytes / MiB, pause: summarize('pause', pauses), resume: summarize('resume', resumes), imageMiB };
}

/** A bundle equal to Capsule's for one sandbox, but running /bin/true, for raw `runsc run`. */
async function rawBundle(dataDir: string, template: OciSpec, index: number, uid: number): Promise<string> {
  const dir = join(dataDir, 'raw-bundles', String(index));
  const workspace = join(dataDir, 'raw-ws', String(index));
  await mkdir(dir, { recursive: true });
  await mkdir(workspace, { recursive: true });
  await chown(workspace, uid, uid);
  const oci: OciSpec = {
    ...template,
    process: { ...template.process, args: ['/bin/true'] },
    mounts: template.mounts.map((m) => (m.destination === '/workspace' ? { ...m, source: workspace } : m)),
    linux: { ...template.linux, cgroupsPath: `/capsule-bench-raw-${process.pid}-${index}` },
  };
  await writeFile(join(dir, 'config.json'), JSON.stringify(oci));
  return dir;
}

async function main(): Promise<void> {
  const args = process.argv.slice(2);
  const option = (name: string, fallback: number): number => {
    const at = args.indexOf(name);
    return at >= 0 ? Number(args[at + 1]) || fallback : fallback;
  };
  const n = option('--n', 10);
  const pauseN = option('--pause-n', 5);
  const json = args.includes('--json');
  const dataDir = await mkdtemp(join(tmpdir(), 'capsule-bench-gvisor-'));
  const host = new HostEnvironment({ dataDir, volumeBytes: 8 * 1024 ** 3 });
  const gvisor = new GvisorBackend({ host });
  const namespace = new NamespaceBackend({ host });
  const rawRoot = join(dataDir, 'raw-runsc');
  await mkdir(rawRoot, { recursive: true });
  try {
    await host.ensure();
    const probe = await gvisor.probe();
    if (!probe.available) throw new Error(`gvisor backend unavailable: ${probe.reason}`);

    // One Capsule sandbox gives the bundle raw runsc runs, so both start the very same container.
    const template = await gvisor.create(parseSpec({ backend: 'gvisor' }), { id: 'bench-template' });
    const oci = JSON.parse(await readFile(join(dataDir, 'gvisor', 'bundles', 'bench-template', 'config.json'), 'utf8')) as OciSpec;
    const uid = oci.linux.uidMappings[1]?.hostID ?? 65534;
    await template.destroy();
    const rootfs = join(dataDir, 'raw-rootfs');
    await rm(rootfs, { recursive: true, force: true });
    await writeRootfs(rootfs, []);
    const info = await probeRunsc();
    // The very flags Capsule gives runsc for a sandbox without network, on a state dir of its own.
    const rawFlags = buildRunscFlags({ rootDir: rawRoot, platform: info.platform, network: 'none' });

    const createSamples: number[] = [];
    const rawSamples: number[] = [];
    const destroySamples: number[] = [];
    for (let i = -1; i < n; i++) {
      // i = -1 warms caches for both; it is not recorded. The order alternates, so neither side
      // always runs right after the other's teardown.
      const bundle = await rawBundle(dataDir, { ...oci, root: { ...oci.root, path: rootfs } }, i + 1, uid);
      const runRaw = (): Promise<number> => timeIt(() => spawnWait(info.binary, [...rawFlags, 'run', '--bundle', bundle, `raw-${i + 1}`]));
      let destroy = 0;
      // Destroyed at once, so raw runsc never shares the machine with an idle sandbox of ours.
      const runCapsule = async (): Promise<number> => {
        let sandbox: BackendSandbox | undefined;
        const ms = await timeIt(async () => {
          sandbox = await gvisor.create(parseSpec({ backend: 'gvisor' }), { id: `bench-create-${i + 1}` });
          await execToExit(sandbox, ['/bin/true']);
        });
        destroy = await timeIt(() => sandbox!.destroy());
        return ms;
      };
      const rawFirst = i % 2 === 0 ? await runRaw() : undefined;
      const capsule = await runCapsule();
      const raw = rawFirst ?? (await runRaw());
      if (i >= 0) {
        rawSamples.push(raw);
        createSamples.push(capsule);
        destroySamples.push(destroy);
      }
    }
    const raw = summarize('raw runsc run /bin/true (same bundle)', rawSamples);
    const created = summarize('capsule gvisor create + first exec', createSamples);
    const destroyed = summarize('capsule gvisor destroy', destroySamples);
    // Each pair ran back to back under the same load: less swayed by the other jobs on a shared machine.
    const pairedRatioP50 = summarize('pairs', createSamples.map((ms, i) => ms / rawSamples[i]!)).p50Ms;

    const pauseRows: PauseRow[] = [];
    for (const held of [50 * MiB, 500 * MiB]) {
      pauseRows.push(await measurePause(gvisor, held, pauseN, dataDir));
      pauseRows.push(await measurePause(namespace, held, pauseN, dataDir));
    }

    const result = {
      machine: { platform: info.platform, runsc: info.version },
      create: { raw, capsule: created, destroy: destroyed, ratioP50: created.p50Ms / raw.p50Ms, pairedRatioP50 },
      pause: pauseRows,
    };
    if (json) {
      console.log(JSON.stringify(result, null, 2));
      return;
    }
    console.log(`runsc: ${info.version}, platform ${info.platform}; n=${n} (create), ${pauseN} (pause)\n`);
    console.log(table([raw, created, destroyed].map((s) => ({ case: s.name, n: s.n, p50Ms: s.p50Ms, p95Ms: s.p95Ms, minMs: s.minMs }))));
    console.log(`\ncreate + first exec / raw runsc run (p50): ${result.create.ratioP50.toFixed(2)}x (target <= 1.3x)`);
    console.log(`median of the ${n} side-by-side pairs' ratios: ${pairedRatioP50.toFixed(2)}x\n`);
    console.log(
      table(
        pauseRows.map((r) => ({
          backend: r.backend === 'gvisor' ? 'gvisor (checkpoint/restore)' : 'namespace (freeze/thaw)',
          heldMiB: r.heldMiB,
          pauseP50Ms: r.pause.p50Ms,
          pauseP95Ms: r.pause.p95Ms,
          resumeP50Ms: r.resume.p50Ms,
          resumeP95Ms: r.resume.p95Ms,
          imageMiB: r.imageMiB === null ? '-' : r.imageMiB.toFixed(1),
        })),
      ),
    );
  } finally {
    await gvisor.reconcile(new Set()).catch((error: Error) => console.error(`cleanup: ${error.message}`));
    await host.volume.unmount().catch(() => undefined);
    await rm(dataDir, { recursive: true, force: true });
  }
}

main().catch((error: unknown) => {
  console.error(error);
  process.exitCode = 1;
});
