import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterEach, describe, expect } from 'vitest';
import { createBackends } from '../../src/backends/registry.js';
import type { BackendSandbox } from '../../src/backends/backend.js';
import { baseEnv } from '../../src/host/sandbox-layout.js';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { HOST_TEMPLATE, parseSpec } from '../../src/sandbox-spec/index.js';
import { StoredTemplates } from '../../src/engine/stored-templates.js';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';
import { testTemplates } from '../helpers/templates.js';
import { CONFORMANCE_TARGETS, conformanceIt, needsConformanceTemplates, type ConformanceTarget } from './backends.js';

needsConformanceTemplates();

afterEach(expectNoLeaks);

const COUNTER = 'i=0; while :; do i=$((i+1)); echo $i > /workspace/n.tmp; mv /workspace/n.tmp /workspace/n; sleep 0.02; done';

async function count(sandbox: BackendSandbox): Promise<number> {
  return Number((await readFile(join(sandbox.workspaceDir, 'n'), 'utf8').catch(() => '0')).trim() || 0);
}

/** Polls every 20 ms until `check` holds, for at most `timeoutMs`. */
// A deadline only a failure reaches: generous, so a busy machine (2 cores shared) cannot trip it.
async function waitUntil(what: string, check: () => Promise<boolean>, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

async function withSandbox({ backend, template }: ConformanceTarget, id: string, fn: (sandbox: BackendSandbox) => Promise<void>): Promise<void> {
  const host = new HostEnvironment({ dataDir: testDataDir() });
  const chosen = createBackends(host).find((b) => b.name === backend);
  if (!chosen) throw new Error(`no backend ${backend}`);
  const image = await new StoredTemplates(testTemplates()).resolve('local', template);
  const layer = image.layerDir !== undefined ? { template: { layerDir: image.layerDir } } : {};
  const sandbox = await chosen.create(parseSpec({ backend, template }), { id: `${id}-${backend}-${template === HOST_TEMPLATE ? 'host' : 'tpl'}`, ...layer });
  try {
    await fn(sandbox);
  } finally {
    await sandbox.destroy();
  }
}

describe.each(CONFORMANCE_TARGETS)('pause and resume on the $backend backend, $template template', (target) => {
  const { backend } = target;
  conformanceIt(target, 'pauses with memory: a counting process stops, then continues from where it was', {}, async () => {
    await withSandbox(target, 'pause-mem', async (sandbox) => {
      await sandbox.exec({ argv: ['sh', '-c', COUNTER], env: baseEnv(), cwd: '/workspace' });
      await waitUntil('the counter to start', async () => (await count(sandbox)) > 3);
      const result = await sandbox.pause!({ keepMemory: true });
      expect(result.keepsMemory).toBe(true);
      expect(result.survivesRestart).toBe(backend === 'gvisor');
      const paused = await count(sandbox);
      await sandbox.resume!();
      // It continues from its own value (memory kept), not from a restart at zero.
      await waitUntil('the counter to continue', async () => (await count(sandbox)) > paused + 3);
    });
  });

  conformanceIt(target, 'pauses without memory: processes end, files stay, new processes run after resume', {}, async () => {
    await withSandbox(target, 'pause-files', async (sandbox) => {
      const counter = await sandbox.exec({ argv: ['sh', '-c', COUNTER], env: baseEnv(), cwd: '/workspace' });
      await waitUntil('the counter to start', async () => (await count(sandbox)) > 3);
      const result = await sandbox.pause!({ keepMemory: false });
      expect(result.keepsMemory).toBe(false);
      const exit = await counter.exited;
      expect(exit.signal === 'SIGKILL' || exit.lost, JSON.stringify(exit)).toBe(true);
      await sandbox.resume!();
      const left = await count(sandbox);
      expect(left).toBeGreaterThan(3);
      const cat = await sandbox.exec({ argv: ['cat', '/workspace/n'], env: baseEnv(), cwd: '/workspace' });
      let text = '';
      cat.onStdout((chunk) => (text += chunk.toString()));
      expect((await cat.exited).exitCode).toBe(0);
      expect(Number(text.trim())).toBe(left);
    });
  });
});
