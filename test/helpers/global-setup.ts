import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { TestProject } from 'vitest/node';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { createBackends } from '../../src/backends/registry.js';
import { describeLeaks, findLeaks, type Leaks } from './leaks.js';

declare module 'vitest' {
  export interface ProvidedContext {
    dataDir: string;
  }
}

/**
 * One data directory and workspace volume for the whole run (mounting one costs ~50 ms). At the
 * end: nothing of ours may remain: the run fails if a cgroup, process, workspace or mount leaked.
 */
export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  const dataDir = await mkdtemp(join(tmpdir(), 'capsule-test-'));
  const host = new HostEnvironment({ dataDir, volumeBytes: 8 * 1024 ** 3 });
  await host.ensure();
  project.provide('dataDir', dataDir);
  return async () => {
    const leaks = await settledLeaks(dataDir);
    const report = { removed: [] as string[] };
    for (const backend of createBackends(host)) {
      report.removed.push(...(await backend.reconcile(new Set())).removed);
      await backend.close?.();
    }
    await host.volume.unmount();
    await rm(dataDir, { recursive: true, force: true });
    const text = describeLeaks(leaks);
    // vitest reports an error thrown here but still exits 0: set the exit code so a leak fails the run.
    if (text) process.exitCode = 1;
    if (text) throw new Error(`the test run left host resources behind (now removed: ${report.removed.join(', ')}): ${text}`);
  };
}

/**
 * The leaks once vitest's own workers have exited. A worker (a node process running vitest) may
 * still be on its way out when teardown starts: running, or already dead and not yet reaped by
 * vitest (a zombie, whose cmdline reads empty, so it cannot be told from any other process). Both
 * are waited for (30 s at most). A worker still there then is a warning, not a leak: it is
 * vitest's process, not a sandbox's; a zombie still unreaped is a leak. Anything else of ours
 * must already be gone.
 */
async function settledLeaks(dataDir: string): Promise<Leaks> {
  const deadline = Date.now() + 30_000;
  for (;;) {
    const leaks = await findLeaks(dataDir);
    const workers: string[] = [];
    const exiting: string[] = [];
    const others: string[] = [];
    for (const line of leaks.processes) {
      const pid = Number(line.split(' ')[0]);
      if (await isVitestWorker(pid)) workers.push(line);
      else if (await isExiting(pid)) exiting.push(line);
      else others.push(line);
    }
    if ((workers.length === 0 && exiting.length === 0) || Date.now() > deadline) {
      if (workers.length > 0) console.warn(`capsule tests: vitest workers still exiting at teardown: ${workers.join(', ')}`);
      return { ...leaks, processes: [...others, ...exiting] };
    }
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

async function isVitestWorker(pid: number): Promise<boolean> {
  const cmdline = await readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => undefined);
  // Gone since it was listed: a worker that finished exiting (the next look will not list it).
  if (cmdline === undefined) return true;
  if (cmdline.split('\0')[0]?.endsWith('node') === true && cmdline.includes('vitest')) return true;
  // A worker that is exiting has released its memory: its cmdline reads empty while its name is
  // still node (a zombie not reaped yet reads the same). Wait for it like any exiting worker.
  const comm = await readFile(`/proc/${pid}/comm`, 'utf8').catch(() => '');
  return cmdline === '' && (comm === '' || comm.trim() === 'node');
}

/**
 * Dead and not yet reaped (state Z or X), releasing its memory (a live process always has a
 * cmdline; one on its way out reads empty), or gone already.
 */
async function isExiting(pid: number): Promise<boolean> {
  const stat = await readFile(`/proc/${pid}/stat`, 'utf8').catch(() => '');
  const state = stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3);
  if (stat === '' || state === 'Z' || state === 'X') return true;
  return (await readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => '')) === '';
}
