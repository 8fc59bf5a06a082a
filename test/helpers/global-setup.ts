import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { TestProject } from 'vitest/node';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { NamespaceBackend } from '../../src/backends/namespace/namespace-backend.host.js';
import { describeLeaks, findLeaks } from './leaks.js';

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
    const leaks = await findLeaks(dataDir);
    const report = await new NamespaceBackend({ host }).reconcile(new Set());
    await host.volume.unmount();
    await rm(dataDir, { recursive: true, force: true });
    const text = describeLeaks(leaks);
    if (text) throw new Error(`the test run left host resources behind (now removed: ${report.removed.join(', ')}): ${text}`);
  };
}
