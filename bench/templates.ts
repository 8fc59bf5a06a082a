/**
 * Template builds: a Debian bootstrap through Capsule (`buildTemplate({ kind: 'debian' })`: its
 * own cgroup and mount namespace, a new subvolume, publish, records) against `mmdebstrap` alone
 * with the same argv (same suite, packages, hooks, the host's apt sources) into a subvolume on
 * the same volume; then a small Dockerfile FROM that template (COPY + RUN in a sandbox + ENV):
 * its first build and its cached rebuild (every step a cache hit: no sandbox, no snapshot).
 * Bootstraps download from the host's apt mirrors; contenders alternate per repetition (the
 * first repetition runs mmdebstrap first, the second Capsule first, ...). Then sandboxes from the
 * bootstrapped template (bench/template-sandboxes.ts): create + first exec against the host
 * template with the warm pool off and on, and disk per sandbox.
 *
 *   node dist/bench/templates.js [--reps 1] [--json] [--sandboxes-only] [--creates 10] [--sandboxes 10]
 *
 * `--sandboxes-only` bootstraps once through Capsule and measures only the sandboxes.
 */
import { spawn } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { SandboxStepRunner } from '../src/engine/build-step-runner.js';
import { HostEnvironment } from '../src/host/host-env.host.js';
import { hostAptSources } from '../src/templates/debian/bootstrap.host.js';
import { mmdebstrapArgv } from '../src/templates/debian/mmdebstrap-args.js';
import { PUBLIC_OWNER } from '../src/templates/names.js';
import { TemplateService } from '../src/templates/template-service.js';
import { percentile, table, timeIt } from './stats.js';
import { measureTemplateSandboxes, type TemplateSandboxFigures } from './template-sandboxes.js';

/** No new repetition starts after this. */
const BUDGET_MS = 40 * 60_000;

function run(argv: string[], env: Record<string, string>): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(argv[0]!, argv.slice(1), { stdio: ['ignore', 'ignore', 'pipe'], env });
    let stderr = '';
    child.stderr.on('data', (chunk: Buffer) => {
      stderr = (stderr + chunk.toString()).slice(-4000);
    });
    child.on('error', reject);
    child.on('close', (code) => (code === 0 ? resolve() : reject(new Error(`${argv[0]} exited ${code}: ${stderr.slice(-800)}`))));
  });
}

const median = (samples: number[]): number => percentile([...samples].sort((a, b) => a - b), 50);

async function main(): Promise<void> {
  const args = process.argv.slice(2);
  const repsArg = args.indexOf('--reps');
  const reps = Math.min(5, Math.max(1, Number(repsArg >= 0 ? args[repsArg + 1] : 1) || 1));
  const json = args.includes('--json');
  const sandboxesOnly = args.includes('--sandboxes-only');
  const numberArg = (name: string, fallback: number) => (args.indexOf(name) >= 0 ? Number(args[args.indexOf(name) + 1]) || fallback : fallback);
  const deadline = Date.now() + BUDGET_MS;
  let sandboxes: TemplateSandboxFigures | undefined;

  const dataDir = await mkdtemp(join(tmpdir(), 'capsule-bench-templates-'));
  const host = new HostEnvironment({ dataDir, volumeBytes: 8 * 1024 ** 3 });
  const steps = new SandboxStepRunner({ host });
  const service = new TemplateService({ host, stepRunner: steps });
  const capsule: number[] = [];
  const alone: number[] = [];
  const firstBuild: number[] = [];
  const rebuild: number[] = [];
  const context = await mkdtemp(join(tmpdir(), 'capsule-bench-context-'));
  try {
    await service.ensure();
    const env = { PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin', LANG: 'C.UTF-8' };
    const bootstrapAlone = async (rep: number): Promise<void> => {
      const temp = await mkdtemp(join(tmpdir(), 'capsule-bench-mmdebstrap-'));
      const target = join(host.volume.mountPoint, `bench-mmdebstrap-${rep}`);
      try {
        const suite = (await hostAptSources('-', temp)).hostSuite ?? 'stable';
        const sources = await hostAptSources(suite, temp);
        await run(['btrfs', 'subvolume', 'create', target], env);
        const argv = mmdebstrapArgv({ suite, packages: [], target, sources: sources.files, keyrings: sources.keyrings });
        alone.push(await timeIt(() => run(argv, { ...env, TMPDIR: temp, HOME: temp })));
      } finally {
        await run(['btrfs', 'subvolume', 'delete', target], env).catch(() => undefined);
        await rm(temp, { recursive: true, force: true });
      }
    };
    const bootstrapCapsule = async (): Promise<void> => {
      await service.remove(PUBLIC_OWNER, 'bench-debian').catch(() => undefined);
      await service.prune();
      capsule.push(await timeIt(() => service.buildTemplate({ owner: PUBLIC_OWNER, name: 'bench-debian', source: { kind: 'debian' } })));
    };
    for (let rep = 0; rep < reps && Date.now() < deadline; rep++) {
      if (sandboxesOnly) {
        await bootstrapCapsule();
        break;
      }
      if (rep % 2 === 0) {
        await bootstrapAlone(rep);
        await bootstrapCapsule();
      } else {
        await bootstrapCapsule();
        await bootstrapAlone(rep);
      }
      // A fresh context per repetition, so the first build misses the cache.
      await writeFile(join(context, 'app.txt'), `repetition ${rep} ${Date.now()}\n`);
      const source = { kind: 'dockerfile' as const, contextDir: context, dockerfileText: 'FROM bench-debian\nCOPY app.txt /srv/app.txt\nRUN wc -c /srv/app.txt > /srv/size\nENV APP=/srv\n' };
      firstBuild.push(await timeIt(() => service.buildTemplate({ owner: PUBLIC_OWNER, name: 'bench-app', source })));
      rebuild.push(await timeIt(() => service.buildTemplate({ owner: PUBLIC_OWNER, name: 'bench-app', source })));
    }
    sandboxes = await measureTemplateSandboxes({ dataDir, host, service, template: 'bench-debian', reps: numberArg('--creates', 10), sandboxes: numberArg('--sandboxes', 10) });
  } finally {
    await steps.close();
    await service.remove(PUBLIC_OWNER, 'bench-app').catch(() => undefined);
    await service.remove(PUBLIC_OWNER, 'bench-debian').catch(() => undefined);
    await service.prune().catch(() => undefined);
    await host.volume.unmount();
    await rm(dataDir, { recursive: true, force: true });
    await rm(context, { recursive: true, force: true });
  }

  const result = {
    benchmark: 'templates',
    reps: capsule.length,
    bootstrapCapsuleMs: median(capsule),
    bootstrapMmdebstrapMs: median(alone),
    ratio: median(capsule) / median(alone),
    firstBuildMs: median(firstBuild),
    cachedRebuildMs: median(rebuild),
    createExec: sandboxes?.createExec,
    diskPerSandboxBytes: sandboxes?.diskPerSandboxBytes,
  };
  if (json) {
    console.log(JSON.stringify(result, null, 2));
    return;
  }
  console.log(table([
    { what: 'Debian bootstrap through Capsule', ms: Math.round(result.bootstrapCapsuleMs), reps: result.reps },
    { what: 'mmdebstrap alone (same argv)', ms: Math.round(result.bootstrapMmdebstrapMs), reps: result.reps },
    { what: 'ratio Capsule / mmdebstrap (target <= 1.2)', ms: Number(result.ratio.toFixed(3)), reps: result.reps },
    { what: 'Dockerfile first build (COPY, RUN, ENV)', ms: Math.round(result.firstBuildMs), reps: result.reps },
    { what: 'cached rebuild (all hits)', ms: Math.round(result.cachedRebuildMs), reps: result.reps },
  ]));
  if (sandboxes) console.log(table(sandboxes.rows));
}

main().catch((error: unknown) => {
  console.error(error);
  process.exitCode = 1;
});
