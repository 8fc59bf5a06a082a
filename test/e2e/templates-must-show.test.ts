import { existsSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Runner } from '../../src/engine/runner.js';
import { StoredTemplates } from '../../src/engine/stored-templates.js';
import { PUBLIC_OWNER } from '../../src/templates/names.js';
import type { TemplateService } from '../../src/templates/template-service.js';
import { BACKENDS } from '../../src/sandbox-spec/index.js';
import { runCli } from '../helpers/cli.js';
import { startRegistry, type TestRegistry } from '../helpers/registry.js';
import { describeResult, expectNoLeaks, testDataDir } from '../helpers/sandbox.js';
import { sharedDebianTemplate, TEST_DEBIAN, testTemplates } from '../helpers/templates.js';

/**
 * Issue 12's must-show, in one pass on this machine with the operator's CLI on the local data
 * directory: the run's bootstrapped Debian template stands for `base`; a Dockerfile FROM it
 * installs a Debian package the host lacks (through the egress proxy, to the host's apt sources
 * only) and copies a file; sandboxes run it on both backends; an unchanged rebuild is a cache hit;
 * `capsule template push` sends it to a registry on loopback, and importing that image back makes
 * a template that runs the same.
 */
const PACKAGE = 'figlet';
const local = { CAPSULE_URL: undefined };
let context: string;
let registry: TestRegistry | undefined;
let service: TemplateService;
let runner: Runner;

beforeAll(async () => {
  service = testTemplates();
  await sharedDebianTemplate(service);
  context = await mkdtemp(join(tmpdir(), 'capsule-must-show-'));
  await writeFile(join(context, 'note.txt'), 'copied from the context\n');
  await writeFile(
    join(context, 'Dockerfile'),
    [`FROM ${TEST_DEBIAN}`, 'COPY note.txt /opt/note.txt', `RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${PACKAGE}`, 'ENV SHOWN=yes', ''].join('\n'),
  );
  runner = new Runner({ dataDir: testDataDir(), templates: new StoredTemplates(service) });
  registry = await startRegistry();
}, 30 * 60_000);

afterAll(async () => {
  await runner?.close();
  await registry?.stop();
  if (context) await rm(context, { recursive: true, force: true });
  for (const name of ['must-show', 'must-show-pulled']) await service?.remove(PUBLIC_OWNER, name).catch(() => undefined);
  await expectNoLeaks();
});

const dataDir = () => ['--data-dir', testDataDir()];
const show = `${PACKAGE} ok >/dev/null && cat /opt/note.txt && echo "$SHOWN $(id -un)"`;

describe('templates, must show', () => {
  it('builds FROM the bootstrapped template with a package the host lacks, runs it on both backends, hits the cache, and round-trips through a loopback registry', async () => {
    expect(existsSync(`/usr/bin/${PACKAGE}`), `the host must lack ${PACKAGE} for this test to mean anything`).toBe(false);
    const built = await runCli(['template', 'build', context, '-t', 'must-show', '--json', ...dataDir()], local);
    expect(built.code, built.stderr).toBe(0);
    expect(JSON.parse(built.stdout)).toMatchObject({ name: 'must-show', source: 'dockerfile' });
    const firstLayer = (await service.resolve(PUBLIC_OWNER, 'must-show')).layer;

    for (const backend of BACKENDS) {
      const result = await runner.run(['/bin/sh', '-c', show], { spec: { template: 'must-show', backend } });
      expect(result.outcome, `${backend}: ${describeResult(result)}`).toBe('ok');
      expect(result.stdout).toBe('copied from the context\nyes user\n');
    }

    // Unchanged: every step from the cache, the same layer.
    const again = await runCli(['template', 'build', context, '-t', 'must-show', '--json', ...dataDir()], local);
    expect(again.code, again.stderr).toBe(0);
    const rebuilt = JSON.parse(again.stdout) as { buildId: string };
    const build = await service.getBuild(PUBLIC_OWNER, rebuilt.buildId);
    expect(build?.steps.filter((s) => s.step !== 'base').map((s) => s.cached)).toEqual([true, true, true]);
    expect((await service.resolve(PUBLIC_OWNER, 'must-show')).layer).toBe(firstLayer);

    // Out as an OCI image to the loopback registry, and back in as a template of its own.
    const image = `${registry!.address}/capsule/must-show:v1`;
    const pushed = await runCli(['template', 'push', 'must-show', image, '--json', ...dataDir()], local);
    expect(pushed.code, pushed.stderr).toBe(0);
    expect(JSON.parse(pushed.stdout)).toMatchObject({ dest: image, digest: expect.stringMatching(/^sha256:[0-9a-f]{64}$/) as unknown });
    const pulled = await service.buildTemplate({ owner: PUBLIC_OWNER, name: 'must-show-pulled', source: { kind: 'image', ref: image } });
    expect(pulled.config).toMatchObject({ user: 'user', workdir: '/home/user', env: { SHOWN: 'yes' } });
    expect(pulled.layer).not.toBe(firstLayer);
    const result = await runner.run(['/bin/sh', '-c', `${show} && stat -c %U:%a /opt/note.txt`], { spec: { template: 'must-show-pulled' } });
    expect(result.outcome, describeResult(result)).toBe('ok');
    expect(result.stdout).toBe('copied from the context\nyes user\nroot:644\n');
    // An apt download, a whole root exported and imported again: minutes on a loaded machine.
  }, 20 * 60_000);
});
