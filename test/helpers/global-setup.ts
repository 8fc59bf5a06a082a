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
    if (text) throw new Error(`the test run left host resources behind (now removed: ${report.removed.join(', ')}): ${text}`);
  };
}

/**
 * The leaks once vitest's own workers have exited. A worker is a direct child of this process and
 * may still be on its way out when teardown starts; anything else of ours must already be gone.
 * Waits at most 10 s for the workers.
 */
async function settledLeaks(dataDir: string): Promise<Leaks> {
  const deadline = Date.now() + 10_000;
  for (;;) {
    const leaks = await findLeaks(dataDir);
    const workers = await directNodeChildren();
    const onlyWorkers = leaks.processes.every((line) => workers.has(Number(line.split(' ')[0])));
    if (!onlyWorkers || Date.now() > deadline) return leaks;
    if (leaks.processes.length === 0) return leaks;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

async function directNodeChildren(): Promise<Set<number>> {
  const children = await readFile(`/proc/${process.pid}/task/${process.pid}/children`, 'utf8').catch(() => '');
  const pids = new Set<number>();
  for (const pid of children.split(' ').filter(Boolean).map(Number)) {
    const comm = await readFile(`/proc/${pid}/comm`, 'utf8').catch(() => '');
    if (comm.trim() === 'node') pids.add(pid);
  }
  return pids;
}
