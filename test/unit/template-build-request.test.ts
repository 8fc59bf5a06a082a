import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { checkBuildRequest, type TemplateBuildRequest, type TemplateSourceSpec } from '../../src/templates/build-request.js';
import { TemplateService } from '../../src/templates/template-service.js';

let dir: string;
let service: TemplateService;

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), 'capsule-treq-'));
  // Refusals only: each is made before the build touches the volume or the records.
  service = new TemplateService({ host: new HostEnvironment({ dataDir: dir }) });
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe('template build requests', () => {
  const base = { owner: 'acme', name: 'x' };

  it('accepts each kind of source', () => {
    const sources: TemplateSourceSpec[] = [
      { kind: 'debian', suite: 'bookworm', packages: ['git'] },
      { kind: 'image', ref: 'docker.io/library/alpine:3.20' },
      { kind: 'dockerfile', contextDir: '/tmp/ctx', dockerfile: 'build/Dockerfile', buildArgs: { V: '1' }, limits: { wallClockMs: 1000 }, network: { mode: 'none' } },
    ];
    for (const source of sources) {
      expect(checkBuildRequest({ ...base, source }).source).toEqual(source);
    }
  });

  it('refuses unknown kinds, unknown keys and bad fields with INVALID_ARGUMENT naming the field', () => {
    const cases: [unknown, string][] = [
      [{ kind: 'git', url: 'x' }, 'source.kind'],
      [{ kind: 'image', ref: 'a', credentials: 'u:p' }, 'source'],
      [{ kind: 'dockerfile', contextDir: '/c', limits: { memoryBytes: 1 } }, 'source.limits.memoryBytes'],
      [{ kind: 'dockerfile', contextDir: '/c', buildArgs: { 'not a name': 'v' } }, 'source.buildArgs'],
    ];
    for (const [source, field] of cases) {
      let caught: unknown;
      try {
        checkBuildRequest({ ...base, source } as TemplateBuildRequest);
      } catch (error) {
        caught = error;
      }
      expect(caught, JSON.stringify(source)).toMatchObject({ code: 'INVALID_ARGUMENT' });
      expect((caught as Error).message).toContain(field);
    }
    expect(() => checkBuildRequest({ ...base, source: { kind: 'image', ref: 'a' }, config: { startCmd: '' } })).toThrow(/config\.startCmd/);
  });

  it('refuses a Dockerfile outside the context unless host paths are allowed', async () => {
    for (const dockerfile of ['/etc/passwd', '../Dockerfile', 'a/../../b']) {
      await expect(service.buildTemplate({ ...base, source: { kind: 'dockerfile', contextDir: dir, dockerfile } })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT', details: { field: 'dockerfile' } });
    }
  });
});
