import { mkdtemp, readdir, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { PUBLIC_OWNER } from '../../src/templates/names.js';
import { ownerTag } from '../../src/templates/owner.js';
import type { BuildRecord, TemplateRecord } from '../../src/templates/records.js';
import { TemplateStore } from '../../src/templates/template-store.js';

let dir: string;
let store: TemplateStore;

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), 'capsule-tstore-'));
  store = new TemplateStore(dir);
  await store.ensure();
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

function record(owner: string, name: string, layer = 'a'.repeat(64)): Omit<TemplateRecord, 'tags'> {
  return {
    id: store.newId(),
    owner,
    name,
    layer,
    config: { env: {}, workdir: '/', user: 'root' },
    size: { referencedBytes: 1, exclusiveBytes: 1 },
    parent: { kind: 'scratch' },
    source: 'dockerfile',
    buildId: '00000000-0000-4000-8000-000000000000',
    createdAt: new Date().toISOString(),
  };
}

describe('template records', () => {
  it('resolves name and name:tag, latest by default, and by id', async () => {
    const v1 = await store.save(record('acme', 'app'), ['v1', 'latest']);
    expect(v1.tags).toEqual(['latest', 'v1']);
    expect((await store.resolve('acme', 'app')).id).toBe(v1.id);
    expect((await store.resolve('acme', 'app:v1')).id).toBe(v1.id);
    expect((await store.resolve('acme', v1.id)).name).toBe('app');
    await expect(store.resolve('acme', 'app:v2')).rejects.toMatchObject({ code: 'TEMPLATE_NOT_FOUND' });
  });

  it('moves a tag to a new build and drops a template left with no tag', async () => {
    const first = await store.save(record('acme', 'app', '1'.repeat(64)), ['latest']);
    const second = await store.save(record('acme', 'app', '2'.repeat(64)), ['latest']);
    expect((await store.resolve('acme', 'app')).id).toBe(second.id);
    expect(await store.get('acme', first.id)).toBeUndefined();
    expect([...(await store.layerRoots())]).toEqual(['2'.repeat(64)]);
  });

  it('scopes lookups: a tenant sees its own and public templates, never another tenant\'s', async () => {
    const mine = await store.save(record('acme', 'app'), ['latest']);
    const theirs = await store.save(record('globex', 'secret'), ['latest']);
    const shared = await store.save(record(PUBLIC_OWNER, 'base'), ['latest']);
    await store.save(record(PUBLIC_OWNER, 'app'), ['latest']);
    expect((await store.resolve('acme', 'app')).id).toBe(mine.id);
    expect((await store.resolve('acme', 'base')).id).toBe(shared.id);
    await expect(store.resolve('acme', 'secret')).rejects.toMatchObject({ code: 'TEMPLATE_NOT_FOUND' });
    await expect(store.resolve('acme', theirs.id)).rejects.toMatchObject({ code: 'TEMPLATE_NOT_FOUND' });
    expect((await store.list('acme')).map((t) => `${t.owner}/${t.name}`).sort()).toEqual(['_public/app', '_public/base', 'acme/app']);
    await expect(store.remove('acme', 'secret')).rejects.toMatchObject({ code: 'TEMPLATE_NOT_FOUND' });
    expect(await store.getBuild('acme', '00000000-0000-4000-8000-000000000000')).toBeUndefined();
  });

  it('removes one tag, or every tag of a bare name', async () => {
    const t = await store.save(record('acme', 'app'), ['latest', 'v1', 'v2']);
    expect(await store.remove('acme', 'app:v1')).toEqual([]);
    expect((await store.get('acme', t.id))!.tags).toEqual(['latest', 'v2']);
    expect(await store.remove('acme', 'app')).toEqual([t.id]);
    expect(await store.list('acme', { only: true })).toEqual([]);
  });

  it('keeps files private (0700 dirs, 0600 files) and leaves no temp after a write', async () => {
    const t = await store.save(record('acme', 'app'), ['latest']);
    expect((await stat(join(dir, 'templates', 'acme'))).mode & 0o777).toBe(0o700);
    expect((await stat(join(dir, 'templates', 'acme', 'templates', `${t.id}.json`))).mode & 0o777).toBe(0o600);
    expect((await readdir(join(dir, 'templates', 'acme', 'templates'))).filter((n) => n.endsWith('.tmp'))).toEqual([]);
  });

  it('reconciles: a build whose process died is marked interrupted; dead writers\' temps go', async () => {
    const build: BuildRecord = { id: '11111111-1111-4111-8111-111111111111', owner: 'acme', target: 'app:latest', status: 'building', startedAt: new Date().toISOString(), steps: [], log: [], logDropped: 0 };
    await store.saveBuild(build, '999999999.1');
    const temp = join(dir, 'templates', 'acme', 'builds', `x.json.999999999.1.abc.tmp`);
    await writeFile(temp, '{');
    const removed = await store.reconcile();
    expect(removed).toContain(`build ${build.id} (interrupted)`);
    expect(await store.getBuild('acme', build.id)).toMatchObject({ status: 'error', error: { code: 'ABORTED' } });
    await expect(stat(temp)).rejects.toMatchObject({ code: 'ENOENT' });
    // A live build (this process) is left alone.
    const live = { ...build, id: '22222222-2222-4222-8222-222222222222' };
    await store.saveBuild(live, ownerTag());
    await store.reconcile();
    expect((await store.getBuild('acme', live.id))!.status).toBe('building');
  });
});
