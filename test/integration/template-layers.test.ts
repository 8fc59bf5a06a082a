import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdir, readFile, readdir, stat, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { WorkspaceVolume } from '../../src/host/volume.host.js';
import { hashParts } from '../../src/templates/keys.js';
import { LayerStore } from '../../src/templates/layer-store.host.js';
import { ownedName } from '../../src/templates/owner.js';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';

const MiB = 1024 * 1024;
let store: LayerStore;
const made: string[] = [];

beforeAll(async () => {
  store = new LayerStore(new WorkspaceVolume({ dataDir: testDataDir() }));
  await store.ensure();
});
afterEach(async () => {
  for (const key of made.splice(0)) await store.delete(key);
  await expectNoLeaks();
});
afterAll(async () => {
  await store.volume.releaseIfIdle();
});

function newKey(): string {
  const key = hashParts('test', randomBytes(8).toString('hex'));
  made.push(key);
  return key;
}

async function layerWith(files: Record<string, string>, parent?: string): Promise<string> {
  const key = newKey();
  const pending = parent ? await store.createFrom(parent) : await store.createEmpty();
  for (const [name, content] of Object.entries(files)) await writeFile(join(pending.root, name), content);
  await store.publish(pending, { key, source: 'step', description: 'test', ...(parent ? { parent } : {}) });
  return key;
}

describe('layer store (btrfs, on the test volume)', () => {
  it('publishes a filled subvolume read-only under its key, in one rename', async () => {
    const key = await layerWith({ hello: 'world' });
    expect(await readFile(join(store.rootOf(key), 'hello'), 'utf8')).toBe('world');
    await expect(writeFile(join(store.rootOf(key), 'more'), 'x')).rejects.toMatchObject({ code: 'EROFS' });
    const meta = await store.meta(key);
    expect(meta).toMatchObject({ key, source: 'step' });
    expect(meta!.subvolumeId).toBeGreaterThan(5);
    expect(await store.pending()).toEqual([]);
    expect((await stat(store.layersDir)).mode & 0o777).toBe(0o700);
  });

  it('keeps the first layer when two fills publish the same key', async () => {
    const key = newKey();
    const first = await store.createEmpty();
    const second = await store.createEmpty();
    await writeFile(join(first.root, 'who'), 'first');
    await writeFile(join(second.root, 'who'), 'second');
    await store.publish(first, { key, source: 'step', description: 'a' });
    const meta = await store.publish(second, { key, source: 'step', description: 'b' });
    expect(meta.description).toBe('a');
    expect(await readFile(join(store.rootOf(key), 'who'), 'utf8')).toBe('first');
    expect(await store.pending()).toEqual([]);
  });

  it('snapshots a layer copy-on-write: children and writable copies leave the parent as it was', async () => {
    const parent = await layerWith({ a: 'parent' });
    const child = await layerWith({ b: 'child' }, parent);
    expect((await readdir(store.rootOf(child))).sort()).toEqual(['a', 'b']);
    expect(await readdir(store.rootOf(parent))).toEqual(['a']);
    const dir = join(store.pendingDir, `${ownedName()}-snap`);
    await store.snapshotWritable(child, dir);
    try {
      await writeFile(join(dir, 'a'), 'changed');
      expect(await readFile(join(store.rootOf(child), 'a'), 'utf8')).toBe('parent');
    } finally {
      await store.deleteSnapshot(dir);
    }
    await expect(store.snapshotWritable(newKey(), join(store.pendingDir, 'x'))).rejects.toMatchObject({ code: 'TEMPLATE_NOT_FOUND' });
  });

  it('counts a layer\'s referenced and exclusive bytes', async () => {
    const big = await layerWith({ blob: 'x'.repeat(3 * MiB) });
    const child = await layerWith({ small: 'y' }, big);
    const usage = await store.usage(big);
    expect(usage!.referencedBytes).toBeGreaterThanOrEqual(3 * MiB);
    const childUsage = await store.usage(child);
    expect(childUsage!.referencedBytes).toBeGreaterThanOrEqual(3 * MiB);
    // The child shares the parent's blob: its own bytes are metadata only.
    expect(childUsage!.exclusiveBytes).toBeLessThan(MiB);
  });

  it('removes a pending layer whose process was killed mid-fill, and only that one', async () => {
    const script = `
      const { LayerStore } = await import(${JSON.stringify(resolve('dist/src/templates/layer-store.host.js'))});
      const { WorkspaceVolume } = await import(${JSON.stringify(resolve('dist/src/host/volume.host.js'))});
      const { writeFileSync } = await import('node:fs');
      const store = new LayerStore(new WorkspaceVolume({ dataDir: ${JSON.stringify(testDataDir())} }));
      await store.ensure();
      const pending = await store.createEmpty();
      writeFileSync(pending.root + '/half', 'x'.repeat(1 << 20));
      console.log(pending.name);
      setInterval(() => {}, 1000);`;
    const child = spawn(process.execPath, ['--input-type=module', '-e', script], { stdio: ['ignore', 'pipe', 'inherit'] });
    const name = await new Promise<string>((resolveName, reject) => {
      child.stdout.once('data', (chunk: Buffer) => resolveName(chunk.toString().trim()));
      child.once('exit', (code) => reject(new Error(`the filler exited early (${code})`)));
    });
    const mine = await store.createEmpty();
    try {
      expect((await store.pending()).sort()).toEqual([name, mine.name].sort());
      // A live owner's pending layer is not touched.
      expect(await store.reconcile()).toEqual([]);
      const exited = new Promise((r) => child.once('exit', r));
      child.kill('SIGKILL');
      await exited;
      expect(await store.reconcile()).toEqual([`pending layer ${name}`]);
      expect(await store.pending()).toEqual([mine.name]);
    } finally {
      await store.discard(mine);
    }
  });

  it('collects layers no root, lease or live sandbox needs, keeping every kept layer\'s ancestors', async () => {
    const base = await layerWith({ base: '1' });
    const mid = await layerWith({ mid: '1' }, base);
    const top = await layerWith({ top: '1' }, mid);
    const orphan = await layerWith({ orphan: 'x'.repeat(MiB) });
    const inUse = await layerWith({ used: '1' });
    const leased = await layerWith({ leased: '1' });
    const lease = ownedName();
    await store.lease(lease, [leased]);
    try {
      const ours = new Set([base, mid, top, orphan, inUse, leased]);
      const others = (await store.list()).map((l) => l.key).filter((k) => !ours.has(k));
      const report = await store.collect({ roots: [top, ...others], isInUse: (key) => key === inUse });
      expect(report.removed).toEqual([orphan]);
      expect(report.freedBytes).toBeGreaterThanOrEqual(MiB);
      made.splice(made.indexOf(orphan), 1);
      for (const key of [base, mid, top, inUse, leased]) expect(await store.has(key)).toBe(true);
    } finally {
      await store.release(lease);
    }
    // A lease records whether the layer exists at the moment it is taken.
    const lease2 = ownedName();
    expect(await store.lease(lease2, [top, hashParts('never made')])).toEqual([true, false]);
    await store.release(lease2);
  });

  it('deletes a layer by unpublishing it first: it is gone from the store at once', async () => {
    const key = await layerWith({ x: '1' });
    await store.delete(key);
    made.splice(made.indexOf(key), 1);
    expect(await store.has(key)).toBe(false);
    expect(await store.pending()).toEqual([]);
    await store.delete(key); // twice is fine
    await mkdir(store.layersDir, { recursive: true });
  });
});
