import { readdir } from 'node:fs/promises';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { SandboxManager } from '../../src/engine/sandbox-manager.js';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';
import { miniCatalog, miniTemplateLayer } from '../helpers/mini-template.js';

/*
 * A template's layer keeps two ready spares (decision 025). A namespace create takes one and
 * replenishes after its first command, 100 ms after its start at the latest, or at its destroy;
 * `keep` on a kept layer does not, so without these the layer's spares would run out after two
 * creates. Real sandboxes from a small layer of host programs.
 */
const T = 'tenant-a';
let engine: SandboxManager;
let host: HostEnvironment;
let layer: string;

/** How many of the layer's spares are ready (not being made). */
async function ready(): Promise<number> {
  const first = host.volume.spares.pathOf(layer).split('/').at(-1)!;
  const names = await readdir(`${host.volume.mountPoint}/spares`).catch(() => [] as string[]);
  return names.filter((name) => name === first || name === `${first}-2`).length;
}

/** Polls until the layer has both spares; the deadline is generous (a snapshot's commit). */
async function bothReady(): Promise<number> {
  for (let deadline = Date.now() + 20_000; Date.now() < deadline; await new Promise((resolve) => setTimeout(resolve, 20))) {
    await host.volume.spares.idle();
    if ((await ready()) === 2) return 2;
  }
  return ready();
}

beforeAll(async () => {
  host = new HostEnvironment({ dataDir: testDataDir() });
  layer = await miniTemplateLayer(host.volume);
  engine = await SandboxManager.open({ dataDir: testDataDir(), host, templates: miniCatalog(layer) });
});
afterAll(async () => {
  await engine.close();
});
afterEach(expectNoLeaks);

describe("a template layer's spares", () => {
  it('are two once the layer is created from, and a create that ran its first command has its taken one replaced', async () => {
    const first = await engine.create({ tenantId: T, spec: { template: 'mini' } });
    await engine.kill(T, first.sandboxId);
    expect(await bothReady()).toBe(2);

    const next = await engine.create({ tenantId: T, spec: { template: 'mini' } });
    try {
      expect((await (await engine.startProcess(T, next.sandboxId, { argv: ['true'] })).result).exitCode).toBe(0);
      expect(await bothReady()).toBe(2);
    } finally {
      await engine.kill(T, next.sandboxId);
    }
  });

  it('are replaced after a create that runs no command, and after one destroyed before it ran any', async () => {
    const idle = await engine.create({ tenantId: T, spec: { template: 'mini' } });
    try {
      expect(await bothReady()).toBe(2);
    } finally {
      await engine.kill(T, idle.sandboxId);
    }

    const killed = await engine.create({ tenantId: T, spec: { template: 'mini' } });
    await engine.kill(T, killed.sandboxId);
    expect(await bothReady()).toBe(2);
  });
});
