/**
 * Sandboxes from a template (run by bench/templates.ts once it has bootstrapped one):
 *
 *  - create + first exec (`true`) from the template vs from the host template, alternating,
 *    with no warm pool and with a warm pool of 2 per template (target: template <= 1.2x host);
 *  - disk per sandbox from the template: N sandboxes, each with a first exec, kept alive; each
 *    root's exclusive bytes (its btrfs quota group, what the quota charges) and the volume's
 *    used bytes (statfs) before and after, over N (target: < 1 MiB a sandbox, copy-on-write).
 */
import { readFile, statfs } from 'node:fs/promises';
import { SandboxManager } from '../src/engine/sandbox-manager.js';
import { StoredTemplates } from '../src/engine/stored-templates.js';
import type { HostEnvironment } from '../src/host/host-env.host.js';
import { runCommand } from '../src/host/run-command.host.js';
import type { TemplateService } from '../src/templates/template-service.js';
import { summarize, timeIt } from './stats.js';

const TENANT = 'bench';
const MiB = 1024 * 1024;

export interface TemplateSandboxFigures {
  rows: Record<string, string | number>[];
  createExec: { pool: 'off' | 'on'; hostP50Ms: number; templateP50Ms: number; ratio: number; warmHits: string }[];
  diskPerSandboxBytes: { qgroupExclusiveMean: number; volumeUsedDelta: number; sandboxes: number };
}

async function volumeUsed(host: HostEnvironment): Promise<number> {
  await runCommand(['btrfs', 'filesystem', 'sync', host.volume.mountPoint]);
  const fs = await statfs(host.volume.mountPoint);
  return (fs.blocks - fs.bfree) * fs.bsize;
}

/** The two halves of a create + first exec, each sample's own. */
interface Parts {
  create: number[];
  exec: number[];
}

async function createExec(engine: SandboxManager, template: string | undefined, parts?: Parts): Promise<number> {
  let id = '';
  try {
    return await timedCreateExec(engine, template, (made) => (id = made), parts);
  } catch (error) {
    const mounts = (await readFile('/proc/self/mountinfo', 'utf8')).split('\n').filter((line) => line.includes('capsule-bench-templates'));
    console.error(`create + exec from ${template ?? 'host'} failed; the bench's mounts now:\n${mounts.join('\n')}`);
    throw error;
  } finally {
    if (id) await engine.kill(TENANT, id);
  }
}

async function timedCreateExec(engine: SandboxManager, template: string | undefined, made: (id: string) => void, parts?: Parts): Promise<number> {
  let id = '';
  return timeIt(async () => {
    const started = performance.now();
    id = (await engine.create({ tenantId: TENANT, spec: template ? { template } : {} })).sandboxId;
    const created = performance.now();
    made(id);
    const result = await (await engine.startProcess(TENANT, id, { argv: ['true'] })).result;
    parts?.create.push(created - started);
    parts?.exec.push(performance.now() - created);
    if (result.exitCode !== 0) throw new Error(`true failed in ${template ?? 'host'}: ${result.stderr}`);
  });
}

/** `create p50 + exec p50` of the samples in `parts`. */
function split(parts: Parts): string {
  const p50 = (samples: number[]) => summarize('', samples).p50Ms.toFixed(1);
  return `create ${p50(parts.create)} + exec ${p50(parts.exec)} ms`;
}

export async function measureTemplateSandboxes(options: { dataDir: string; host: HostEnvironment; service: TemplateService; template: string; reps: number; sandboxes: number }): Promise<TemplateSandboxFigures> {
  const { dataDir, host, service, template } = options;
  const rows: Record<string, string | number>[] = [];
  const createRows: TemplateSandboxFigures['createExec'] = [];
  for (const pool of ['off', 'on'] as const) {
    let warm = 0;
    let creates = 0;
    // An engine's close lets an idle volume go (template layers do not count as in use), and the
    // host remembers it was ready: the next engine needs the volume mounted again.
    await host.volume.ensure();
    const engine = await SandboxManager.open({
      dataDir,
      host,
      templates: new StoredTemplates(service),
      ...(pool === 'on' ? { warmPool: { host: 2, [template]: 2 } } : {}),
      onEvent: (event) => {
        if (event.type !== 'sandbox.created') return;
        creates++;
        if (event.poolWarm) warm++;
      },
    });
    try {
      // One of each first: the template's first sandbox reads its layer's metadata cold.
      await createExec(engine, undefined);
      await createExec(engine, template);
      creates = warm = 0;
      const fromHost: number[] = [];
      const fromTemplate: number[] = [];
      const hostParts: Parts = { create: [], exec: [] };
      const templateParts: Parts = { create: [], exec: [] };
      for (let i = 0; i < options.reps; i++) {
        // The pool refills in the background: give it time, so each create may find one ready.
        if (pool === 'on') await new Promise((resolve) => setTimeout(resolve, 1500));
        if (i % 2 === 0) {
          fromHost.push(await createExec(engine, undefined, hostParts));
          fromTemplate.push(await createExec(engine, template, templateParts));
        } else {
          fromTemplate.push(await createExec(engine, template, templateParts));
          fromHost.push(await createExec(engine, undefined, hostParts));
        }
      }
      const h = summarize(`create + first exec, host template, pool ${pool}`, fromHost);
      const t = summarize(`create + first exec, template ${template}, pool ${pool}`, fromTemplate);
      const warmHits = `${warm}/${creates}`;
      rows.push({ measure: h.name, n: h.n, p50Ms: h.p50Ms, p95Ms: h.p95Ms, note: `warm ${warmHits} (both); ${split(hostParts)}` });
      rows.push({ measure: t.name, n: t.n, p50Ms: t.p50Ms, p95Ms: t.p95Ms, note: `ratio ${(t.p50Ms / h.p50Ms).toFixed(2)} (target <= 1.2); ${split(templateParts)}` });
      createRows.push({ pool, hostP50Ms: h.p50Ms, templateP50Ms: t.p50Ms, ratio: t.p50Ms / h.p50Ms, warmHits });
    } finally {
      await engine.close();
    }
  }

  // Disk: N live sandboxes from the template, each having run a process.
  await host.volume.ensure();
  const engine = await SandboxManager.open({ dataDir, host, templates: new StoredTemplates(service) });
  const ids: string[] = [];
  try {
    const before = await volumeUsed(host);
    for (let i = 0; i < options.sandboxes; i++) {
      const id = (await engine.create({ tenantId: TENANT, spec: { template, ttlMs: 600_000 } })).sandboxId;
      ids.push(id);
      await (await engine.startProcess(TENANT, id, { argv: ['true'] })).result;
    }
    const after = await volumeUsed(host);
    const exclusive: number[] = [];
    for (const id of ids) exclusive.push((await host.volume.usedBytes(id)) ?? Number.NaN);
    const mean = exclusive.reduce((a, b) => a + b, 0) / exclusive.length;
    const delta = (after - before) / ids.length;
    rows.push({ measure: `disk per sandbox from ${template}: root's exclusive bytes (qgroup)`, n: ids.length, p50Ms: '', p95Ms: '', note: `${(mean / 1024).toFixed(1)} KiB mean (target < 1 MiB)` });
    rows.push({ measure: `disk per sandbox from ${template}: volume used, after - before, / N`, n: ids.length, p50Ms: '', p95Ms: '', note: `${(delta / 1024).toFixed(1)} KiB (${(delta / MiB).toFixed(3)} MiB)` });
    return { rows, createExec: createRows, diskPerSandboxBytes: { qgroupExclusiveMean: mean, volumeUsedDelta: delta, sandboxes: ids.length } };
  } finally {
    for (const id of ids) await engine.kill(TENANT, id).catch(() => undefined);
    await engine.close();
  }
}
