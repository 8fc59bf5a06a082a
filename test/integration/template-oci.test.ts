import { spawnSync } from 'node:child_process';
import { chmod, mkdtemp, readdir, readFile, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { isSandboxError } from '../../src/errors/index.js';
import { imageLayerKey } from '../../src/templates/keys.js';
import type { TemplateService } from '../../src/templates/template-service.js';
import { buildTinyImage, pushImage } from '../helpers/oci-image.js';
import { startRegistry, type TestRegistry } from '../helpers/registry.js';
import { expectNoLeaksExcept } from '../helpers/sandbox.js';
import { testTemplates } from '../helpers/templates.js';

const OWNER = 'oci-tests';
const AUTH = { username: 'capsule', password: 'right-password' };
let service: TemplateService;
let work: string;
let layout: string;
let open: TestRegistry;
let locked: TestRegistry;

beforeAll(async () => {
  service = testTemplates();
  await service.ensure();
  work = await mkdtemp(join(tmpdir(), 'capsule-oci-'));
  layout = join(work, 'layout');
  await buildTinyImage(work, layout, 'v2');
  await buildTinyImage(work, layout, 'big', { ownedBy: 70_000 });
  open = await startRegistry();
  locked = await startRegistry({ auth: AUTH });
  await pushImage(work, layout, 'v2', `${open.address}/capsule/tiny:v2`);
  await pushImage(work, layout, 'big', `${open.address}/capsule/big:v1`);
  await pushImage(work, layout, 'v2', `${locked.address}/capsule/tiny:v2`, AUTH);
}, 180_000);
afterAll(async () => {
  await open?.stop();
  await locked?.stop();
  await rm(work, { recursive: true, force: true });
  for (const registry of await service.credentials.registries()) await service.credentials.remove(registry);
});
afterEach(() => expectNoLeaksExcept([open.pid, locked.pid]));

/** The error an import fails with, after checking that it left no template behind. */
async function failedImport(ref: string, name: string): Promise<{ code: string; message: string; hint?: string }> {
  const error = await service.importImage({ owner: OWNER, ref, name }).then(
    () => undefined,
    (e: unknown) => e,
  );
  if (!isSandboxError(error)) throw new Error(`expected a SandboxError, got ${String(error)}`);
  expect(await service.store.find(OWNER, name)).toBeUndefined();
  expect(await service.layers.pending()).toEqual([]);
  return { code: error.code, message: error.message, hint: error.hint };
}

describe('OCI images (skopeo + umoci, a registry on loopback)', () => {
  it('imports an image: layers applied with whiteouts and opaque dirs, owners kept, config kept', async () => {
    const logs: string[] = [];
    const template = await service.importImage({ owner: OWNER, ref: `${open.address}/capsule/tiny:v2`, name: 'tiny:v2', onLog: (e) => logs.push(e.message) });
    expect(template).toMatchObject({ owner: OWNER, name: 'tiny', tags: ['v2'], source: 'image' });
    expect(template.parent).toMatchObject({ kind: 'image', ref: `${open.address}/capsule/tiny:v2` });
    expect(template.layer).toBe(imageLayerKey((template.parent as { digest: string }).digest));
    expect(template.config).toEqual({ env: { A: '1', PATH: '/bin' }, workdir: '/opt', user: 'app', startCmd: "/bin/sh -c 'echo hi'" });
    const root = service.layers.rootOf(template.layer);
    expect(await readFile(join(root, 'opt/hello.txt'), 'utf8')).toBe('hello from the image\n');
    await expect(stat(join(root, 'etc/motd'))).rejects.toMatchObject({ code: 'ENOENT' });
    expect((await readdir(join(root, 'etc/conf.d'))).sort()).toEqual(['c']);
    expect(await readFile(join(root, 'etc/keep/k'), 'utf8')).toBe('kept\n');
    const owned = await stat(join(root, 'opt/owned/file'));
    expect([owned.uid, owned.gid]).toEqual([1001, 1001]);
    expect(logs.some((l) => l.startsWith('pulling'))).toBe(true);
    const build = await service.getBuild(OWNER, template.buildId);
    expect(build).toMatchObject({ status: 'ready', steps: [{ step: 'base', cached: false }] });
  });

  it('imports the same image again from its layer: no pull, no unpack, the same layer (also by digest)', async () => {
    const first = await service.resolve(OWNER, 'tiny:v2');
    const digest = (first.parent as { digest: string }).digest;
    const logs: string[] = [];
    const again = await service.importImage({ owner: OWNER, ref: `${open.address}/capsule/tiny@${digest}`, name: 'tiny:by-digest', onLog: (e) => logs.push(e.message) });
    expect(again.layer).toBe(first.layer);
    expect(logs.some((l) => l.includes('already imported'))).toBe(true);
    expect(logs.some((l) => l.startsWith('pulling'))).toBe(false);
  });

  it('buildTemplate imports an image too, with start and ready commands set on top of the image\'s', async () => {
    const template = await service.buildTemplate({
      owner: OWNER,
      name: 'tiny-ready',
      source: { kind: 'image', ref: `${open.address}/capsule/tiny:v2` },
      config: { startCmd: 'exec /bin/serve', readyCmd: 'test -e /tmp/ready' },
    });
    expect(template).toMatchObject({ name: 'tiny-ready', source: 'image' });
    expect(template.config).toEqual({ env: { A: '1', PATH: '/bin' }, workdir: '/opt', user: 'app', startCmd: 'exec /bin/serve', readyCmd: 'test -e /tmp/ready' });
    // A tenant's build names no host path: an oci: layout is refused before anything is made.
    await expect(service.buildTemplate({ owner: OWNER, name: 'from-host', source: { kind: 'image', ref: 'oci:/etc:x' } })).rejects.toMatchObject({ code: 'PERMISSION_DENIED' });
  });

  it('imports from an OCI layout and an archive on the host only when the operator allows host paths', async () => {
    const denied = await failedImport(`oci:${layout}:v2`, 'from-layout');
    expect(denied.code).toBe('PERMISSION_DENIED');
    const fromLayout = await service.importImage({ owner: OWNER, ref: `oci:${layout}:v2`, name: 'from-layout', allowHostPaths: true });
    expect(fromLayout.config.user).toBe('app');
    const archive = join(work, 'tiny.tar');
    const copy = spawnSync('skopeo', ['--insecure-policy', 'copy', '--quiet', `oci:${layout}:v2`, `oci-archive:${archive}`], { encoding: 'utf8' });
    expect(copy.status, copy.stderr).toBe(0);
    const fromArchive = await service.importImage({ owner: OWNER, ref: `oci-archive:${archive}`, name: 'from-archive', allowHostPaths: true });
    expect(await readFile(join(service.layers.rootOf(fromArchive.layer), 'opt/hello.txt'), 'utf8')).toBe('hello from the image\n');
  });

  it('says clearly when the registry is unreachable, the tag unknown or the repository missing', async () => {
    const unreachable = await failedImport('127.0.0.1:1/capsule/tiny:v2', 'unreachable');
    expect(unreachable.code).toBe('REGISTRY_UNREACHABLE');
    expect(unreachable.message).toMatch(/^cannot reach the registry of 127\.0\.0\.1:1\/capsule\/tiny:v2: .*connection refused/);
    const unknownTag = await failedImport(`${open.address}/capsule/tiny:nope`, 'unknown-tag');
    expect(unknownTag.code).toBe('IMAGE_NOT_FOUND');
    expect(unknownTag.message).toMatch(/manifest unknown/);
    expect((await failedImport(`${open.address}/capsule/absent:v1`, 'absent')).code).toBe('IMAGE_NOT_FOUND');
    const build = (await readdir(join(service.store.dir, OWNER, 'builds'))).length;
    expect(build).toBeGreaterThanOrEqual(3);
  });

  it('pulls from a registry with auth only with the operator\'s stored credentials, never taking wrong ones', async () => {
    const ref = `${locked.address}/capsule/tiny:v2`;
    const anonymous = await failedImport(ref, 'locked');
    expect(anonymous.code).toBe('REGISTRY_UNAUTHORIZED');
    expect(anonymous.message).toContain('without credentials');
    await service.credentials.set(locked.address, AUTH.username, 'wrong-password');
    const wrong = await failedImport(ref, 'locked');
    expect(wrong.code).toBe('REGISTRY_UNAUTHORIZED');
    expect(wrong.message).toContain('with the stored credentials');
    expect(wrong.message).not.toContain('wrong-password');
    // A credentials file others could read is not the operator's: refused before any pull.
    await chmod(service.credentials.path, 0o644);
    expect((await failedImport(ref, 'locked')).code).toBe('HOST_NOT_READY');
    await chmod(service.credentials.path, 0o600);
    await service.credentials.set(locked.address, AUTH.username, AUTH.password);
    expect((await stat(service.credentials.path)).mode & 0o777).toBe(0o600);
    const template = await service.importImage({ owner: OWNER, ref, name: 'locked' });
    expect(template.config.user).toBe('app');
  });

  it('refuses an image with files owned past uid 65535, naming the file', async () => {
    const error = await failedImport(`${open.address}/capsule/big:v1`, 'big');
    expect(error.code).toBe('IMAGE_UNSUPPORTED');
    expect(error.message).toContain('/opt/owned');
    expect(error.hint).toMatch(/ids below 65536/);
  });

  it('prune removes the layers and image blobs of removed templates and reports the bytes', async () => {
    const tiny = await service.resolve(OWNER, 'tiny:v2');
    for (const ref of ['tiny', 'tiny-ready', 'from-layout', 'from-archive', 'locked']) await service.remove(OWNER, ref);
    const report = await service.prune();
    expect(report.removedLayers).toContain(tiny.layer);
    expect(await service.layers.has(tiny.layer)).toBe(false);
    expect(report.freedImageCacheBytes).toBeGreaterThan(0);
    await expect(service.resolve(OWNER, 'tiny:v2')).rejects.toMatchObject({ code: 'TEMPLATE_NOT_FOUND' });
  });
});
