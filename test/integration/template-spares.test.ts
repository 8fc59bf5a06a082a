import { readdir } from 'node:fs/promises';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { NamespaceBackend } from '../../src/backends/namespace/namespace-backend.host.js';
import { SandboxManager } from '../../src/engine/sandbox-manager.js';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';
import { miniCatalog, miniTemplateLayer } from '../helpers/mini-template.js';

/*
 * A template's layer keeps two ready spares (decision 025). A namespace create takes one and
 * replenishes when its first command ends, firstCommandGraceMs after its start at the latest, or
 * at its destroy; `keep` on a kept layer does not, so without these the layer's spares would run
 * out after two creates. Real sandboxes from a small layer of host programs; one engine whose
 * grace never ends within a test (so only the command or the destroy can replenish), one with
 * the default grace.
 */
const T = 'tenant-a';
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
});
afterEach(expectNoLeaks);

describe("a template layer's spares, the grace far away", () => {
  let engine: SandboxManager;
  beforeAll(async () => {
    const backend = new NamespaceBackend({ host, firstCommandGraceMs: 600_000 });
    engine = await SandboxManager.open({ dataDir: testDataDir(), host, backends: [backend], templates: miniCatalog(layer) });
  });
  afterAll(() => engine.close());

  it('are two once the layer is created from, and the one a create took is replaced when its first command ends', async () => {
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

  it('are replaced after a create destroyed before it ran anything', async () => {
    const killed = await engine.create({ tenantId: T, spec: { template: 'mini' } });
    await engine.kill(T, killed.sandboxId);
    expect(await bothReady()).toBe(2);
  });
});

describe("a template layer's spares, the default grace", () => {
  let engine: SandboxManager;
  beforeAll(async () => {
    engine = await SandboxManager.open({ dataDir: testDataDir(), host, templates: miniCatalog(layer) });
  });
  afterAll(() => engine.close());

  it('are replaced after a create that runs no command, once its grace has passed', async () => {
    // The first create keeps the layer (both spares made); the second takes one.
    await engine.kill(T, (await engine.create({ tenantId: T, spec: { template: 'mini' } })).sandboxId);
    expect(await bothReady()).toBe(2);
    const idle = await engine.create({ tenantId: T, spec: { template: 'mini' } });
    try {
      expect(await bothReady()).toBe(2);
    } finally {
      await engine.kill(T, idle.sandboxId);
    }
  });
});
