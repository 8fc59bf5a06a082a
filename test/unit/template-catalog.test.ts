import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { StoredTemplates } from '../../src/engine/stored-templates.js';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { PUBLIC_OWNER } from '../../src/templates/names.js';
import type { TemplateRecord } from '../../src/templates/records.js';
import { shellJoin } from '../../src/templates/shell-quote.js';
import { TemplateService } from '../../src/templates/template-service.js';

let dir: string;
let service: TemplateService;

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), 'capsule-tcat-'));
  // Records only: nothing here touches the volume (rootOf is a path, resolve reads JSON files).
  service = new TemplateService({ host: new HostEnvironment({ dataDir: dir }) });
  await service.store.ensure();
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

function record(owner: string, name: string, config: TemplateRecord['config']): Omit<TemplateRecord, 'tags'> {
  return {
    id: service.store.newId(),
    owner,
    name,
    layer: 'c'.repeat(64),
    config,
    size: { referencedBytes: 1, exclusiveBytes: 1 },
    parent: { kind: 'scratch' },
    source: 'dockerfile',
    buildId: '00000000-0000-4000-8000-000000000000',
    createdAt: new Date().toISOString(),
  };
}

describe('StoredTemplates (the engine\'s TemplateCatalog over the template store)', () => {
  it('resolves a tenant\'s template to its layer and config; another tenant gets TEMPLATE_NOT_FOUND', async () => {
    const config = { env: { A: '1' }, workdir: '/srv', user: 'user', startCmd: 'python3 -m http.server', readyCmd: 'curl -sf localhost:8000' };
    const saved = await service.store.save(record('acme', 'web', config), ['v1']);
    const catalog = new StoredTemplates(service);
    const image = await catalog.resolve('acme', 'web:v1');
    expect(image).toEqual({ ref: 'web:v1', layerDir: service.layers.rootOf('c'.repeat(64)), ...config });
    expect((await catalog.resolve('acme', saved.id)).ref).toBe(saved.id);
    await expect(catalog.resolve('globex', 'web:v1')).rejects.toMatchObject({ code: 'TEMPLATE_NOT_FOUND' });
    await expect(catalog.resolve('globex', saved.id)).rejects.toMatchObject({ code: 'TEMPLATE_NOT_FOUND' });
    await expect(catalog.resolve('acme', 'web')).rejects.toMatchObject({ code: 'TEMPLATE_NOT_FOUND' });
  });

  it('public templates are every tenant\'s; "host" stays the host template; the default ref is the operator\'s', async () => {
    await service.store.save(record(PUBLIC_OWNER, 'base', { env: {}, workdir: '/home/user', user: 'user' }), ['latest']);
    const catalog = new StoredTemplates(service, 'base');
    expect(catalog.defaultRef).toBe('base');
    for (const tenant of ['acme', 'globex']) expect(await catalog.resolve(tenant, 'base')).toEqual({ ref: 'base:latest', layerDir: service.layers.rootOf('c'.repeat(64)), env: {}, workdir: '/home/user', user: 'user' });
    expect(await catalog.resolve('acme', 'host')).toEqual({ ref: 'host', env: {} });
    expect(new StoredTemplates(service).defaultRef).toBe('host');
  });
});

describe('shellJoin (start commands as shell lines)', () => {
  it('quotes only what needs it, and quotes quotes', () => {
    expect(shellJoin(['python3', 'main.py'])).toBe('python3 main.py');
    expect(shellJoin(['/bin/sh', '-c', 'echo hi; exit 3'])).toBe("/bin/sh -c 'echo hi; exit 3'");
    expect(shellJoin(['echo', "it's", ''])).toBe("echo 'it'\\''s' ''");
  });
});
