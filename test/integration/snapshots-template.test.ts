import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { SandboxManager } from '../../src/engine/sandbox-manager.js';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';
import { layerMarker, miniCatalog, miniTemplateLayer } from '../helpers/mini-template.js';

/**
 * Snapshots of sandboxes from a template: the whole root (its /workspace inside) is snapshotted,
 * a sandbox made from it has the same root back, and changes are measured against the template
 * layer or the snapshot. Real sandboxes on the real volume.
 */
let engine: SandboxManager;
let layer: string;
const TENANT = 't1';

beforeAll(async () => {
  layer = await miniTemplateLayer(new HostEnvironment({ dataDir: testDataDir() }).volume);
  engine = await SandboxManager.open({ dataDir: testDataDir(), templates: miniCatalog(layer) });
});
afterAll(async () => {
  await engine?.close();
});
afterEach(expectNoLeaks);

async function sh(sandboxId: string, line: string, user?: string): Promise<string> {
  const handle = await engine.startProcess(TENANT, sandboxId, { argv: ['/bin/sh', '-c', line], ...(user ? { user } : {}) });
  const result = await handle.result;
  expect(result.exitCode, `${line}: ${result.stderr}`).toBe(0);
  return result.stdout;
}

describe('snapshots of template sandboxes', () => {
  it('root and workspace come back in a sandbox made from the snapshot; changes are against the layer, then the snapshot', async () => {
    const source = await engine.create({ tenantId: TENANT, spec: { template: 'mini', ttlMs: 60_000 } });
    const made: string[] = [source.sandboxId];
    try {
      await sh(source.sandboxId, 'echo conf > /etc/added && echo w > /workspace/w', 'root');
      const sourceChanges = await engine.changes(TENANT, source.sandboxId);
      expect(sourceChanges.origin).toEqual({ template: 'mini:latest' });
      expect(sourceChanges.changes.filter((c) => c.kind !== 'modified' || c.type !== 'dir').map((c) => `${c.kind} ${c.path}`)).toEqual(['added /etc/added', 'added /workspace/w']);

      const snapshot = await engine.snapshot(TENANT, source.sandboxId);
      expect(snapshot).toMatchObject({ disk: 'root', template: 'mini:latest', sandboxId: source.sandboxId });
      const copy = await engine.create({ tenantId: TENANT, spec: { snapshot: snapshot.snapshotId } });
      made.push(copy.sandboxId);
      expect(copy.spec.template).toBe('mini:latest');
      expect(copy.spec.user).toBe('user');
      expect(await sh(copy.sandboxId, 'cat /etc/added /workspace/w /etc/template-marker; whoami')).toBe('conf\nw\nmini\nuser\n');
      expect((await engine.changes(TENANT, copy.sandboxId)).changes).toEqual([]);
      await sh(copy.sandboxId, 'echo r > /root/r && rm /etc/added', 'root');
      expect((await engine.changes(TENANT, copy.sandboxId)).changes.filter((c) => c.type !== 'dir').map((c) => `${c.kind} ${c.path}`)).toEqual(['deleted /etc/added', 'added /root/r']);
      // The template layer was never written.
      expect(await layerMarker(layer)).toBe('mini\n');

      for (const id of made) await engine.kill(TENANT, id);
      await engine.deleteSnapshot(TENANT, snapshot.snapshotId);
    } finally {
      for (const id of made) await engine.kill(TENANT, id).catch(() => undefined);
      for (const s of engine.listSnapshots(TENANT)) await engine.deleteSnapshot(TENANT, s.snapshotId);
    }
  }, 120_000);
});
