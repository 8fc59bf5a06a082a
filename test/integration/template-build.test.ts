import { lstat, mkdir, mkdtemp, readdir, readFile, readlink, rm, stat, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { isSandboxError, type SandboxError } from '../../src/errors/index.js';
import { SandboxStepRunner } from '../../src/engine/build-step-runner.js';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import type { RunStep, RunStepOptions, StepResult, StepRunner } from '../../src/templates/builder/step-runner.js';
import type { TemplateService } from '../../src/templates/template-service.js';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';
import { sharedDebianTemplate, testTemplates, TEST_DEBIAN } from '../helpers/templates.js';

const OWNER = 'builder';
let service: TemplateService;
let sandboxes: SandboxStepRunner;
let runner: RecordingStepRunner;
let context: string;

/** The engine's step runner, recording what the builder asks of it. */
class RecordingStepRunner implements StepRunner {
  readonly steps: RunStep[] = [];

  constructor(private readonly inner: StepRunner) {}

  run(step: RunStep, options: RunStepOptions): Promise<StepResult> {
    this.steps.push(step);
    return this.inner.run(step, options);
  }
}

const DOCKERFILE = `# a Capsule template
FROM ${TEST_DEBIAN}
ARG GREETING=hello
ENV APP_HOME=/srv/app \\
    GREETING=\${GREETING}
WORKDIR $APP_HOME
COPY app/ ./
COPY --chown=user:user --chmod=0640 config.txt conf/
USER user
CMD ["python3", "main.py"]
`;

beforeAll(async () => {
  sandboxes = new SandboxStepRunner({ host: new HostEnvironment({ dataDir: testDataDir() }) });
  runner = new RecordingStepRunner(sandboxes);
  service = testTemplates({ stepRunner: runner });
  await sharedDebianTemplate(service);
  context = await mkdtemp(join(tmpdir(), 'capsule-context-'));
  await mkdir(join(context, 'app/lib'), { recursive: true });
  await mkdir(join(context, 'app/node_modules/dep'), { recursive: true });
  await writeFile(join(context, 'app/main.py'), 'print("hi")\n');
  await writeFile(join(context, 'app/lib/util.py'), 'X = 1\n');
  await writeFile(join(context, 'app/secret.env'), 'TOKEN=nope\n');
  await writeFile(join(context, 'app/node_modules/dep/index.js'), '\n');
  await writeFile(join(context, 'app/debug.log'), 'noise\n');
  await writeFile(join(context, 'app/keep.log'), 'kept\n');
  await writeFile(join(context, 'config.txt'), 'setting=1\n');
  await writeFile(join(context, '.dockerignore'), '**/secret.env\n**/node_modules\n*/*.log\n!app/keep.log\n');
  await writeFile(join(context, 'Dockerfile'), DOCKERFILE);
}, 20 * 60_000);
afterAll(async () => {
  await sandboxes?.close();
  await rm(context, { recursive: true, force: true });
});
afterEach(expectNoLeaks);

async function layerKeys(): Promise<string[]> {
  return (await service.layers.list()).map((layer) => layer.key).sort();
}

async function buildError(promise: Promise<unknown>): Promise<SandboxError> {
  const error = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  if (!isSandboxError(error)) throw new Error(`expected a SandboxError, got ${String(error)}`);
  return error;
}

async function dockerfileContext(files: Record<string, string>): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'capsule-context-'));
  for (const [name, content] of Object.entries(files)) {
    await mkdir(join(dir, name, '..'), { recursive: true });
    await writeFile(join(dir, name), content);
  }
  return dir;
}

describe('Dockerfile builds FROM the bootstrapped template (COPY, ENV, ARG, WORKDIR, USER, CMD)', () => {
  it('builds: files copied with .dockerignore applied, owners and modes as asked, config kept', async () => {
    const logs: string[] = [];
    const template = await service.build({ owner: OWNER, name: 'app:v1', contextDir: context, onLog: (e) => logs.push(`${e.step} ${e.message}`) });
    expect(template).toMatchObject({ owner: OWNER, name: 'app', tags: ['v1'], source: 'dockerfile', parent: { kind: 'template', name: TEST_DEBIAN } });
    expect(template.config).toMatchObject({ workdir: '/srv/app', user: 'user', startCmd: 'python3 main.py' });
    expect(template.config.env).toMatchObject({ APP_HOME: '/srv/app', GREETING: 'hello', LANG: 'C.UTF-8' });
    expect(template.config.env.PATH).toContain('/usr/bin');
    const root = service.layers.rootOf(template.layer);
    expect(await readFile(join(root, 'srv/app/main.py'), 'utf8')).toBe('print("hi")\n');
    expect(await readFile(join(root, 'srv/app/lib/util.py'), 'utf8')).toBe('X = 1\n');
    expect(await readFile(join(root, 'srv/app/keep.log'), 'utf8')).toBe('kept\n');
    for (const ignored of ['secret.env', 'node_modules', 'debug.log']) await expect(lstat(join(root, 'srv/app', ignored)), ignored).rejects.toMatchObject({ code: 'ENOENT' });
    const main = await stat(join(root, 'srv/app/main.py'));
    expect([main.uid, main.gid]).toEqual([0, 0]);
    const config = await stat(join(root, 'srv/app/conf/config.txt'));
    expect([config.uid, config.gid, config.mode & 0o7777]).toEqual([1000, 1000, 0o640]);
    // The base template is unchanged: the steps wrote to their own snapshots.
    await expect(lstat(join(service.layers.rootOf((await service.resolve(OWNER, TEST_DEBIAN)).layer), 'srv/app'))).rejects.toMatchObject({ code: 'ENOENT' });
    expect(logs).toEqual(expect.arrayContaining(['3 step 3/7: WORKDIR $APP_HOME', '4 step 4/7: COPY app/ ./', '4 copied 4 entries to /srv/app/']));
    const build = await service.getBuild(OWNER, template.buildId);
    expect(build!.steps.filter((s) => !s.cached).map((s) => s.instruction)).toEqual(['WORKDIR $APP_HOME', 'COPY app/ ./', 'COPY --chown=user:user --chmod=0640 config.txt conf/']);
  });

  it('rebuilds unchanged from the cache: every step a hit, no new layer, no step run', async () => {
    const before = await layerKeys();
    const first = await service.resolve(OWNER, 'app:v1');
    const again = await service.build({ owner: OWNER, name: 'app:v1', contextDir: context });
    expect(again.layer).toBe(first.layer);
    expect(await layerKeys()).toEqual(before);
    const build = await service.getBuild(OWNER, again.buildId);
    expect(build!.steps.every((s) => s.cached)).toBe(true);
  });

  it('rebuilds only from the first changed input: a changed file, a changed build arg', async () => {
    const v1 = await service.getBuild(OWNER, (await service.resolve(OWNER, 'app:v1')).buildId);
    await writeFile(join(context, 'config.txt'), 'setting=2\n');
    try {
      const changed = await service.build({ owner: OWNER, name: 'app:v2', contextDir: context });
      const steps = (await service.getBuild(OWNER, changed.buildId))!.steps;
      expect(steps.filter((s) => !s.cached).map((s) => s.instruction)).toEqual(['COPY --chown=user:user --chmod=0640 config.txt conf/']);
      expect(steps.find((s) => s.instruction === 'COPY app/ ./')!.key).toBe(v1!.steps.find((s) => s.instruction === 'COPY app/ ./')!.key);
      // The file's mtime is not part of the key: touching it back to the old content hits again.
      await writeFile(join(context, 'config.txt'), 'setting=1\n');
      const back = await service.build({ owner: OWNER, name: 'app:v1', contextDir: context });
      expect((await service.getBuild(OWNER, back.buildId))!.steps.every((s) => s.cached)).toBe(true);
      const bye = await service.build({ owner: OWNER, name: 'app:bye', contextDir: context, buildArgs: { GREETING: 'bye', UNUSED: 'x' } });
      expect(bye.config.env.GREETING).toBe('bye');
      expect((await service.getBuild(OWNER, bye.buildId))!.steps.filter((s) => !s.cached).length).toBe(3);
      // An undeclared build arg changes nothing.
      const unused = await service.build({ owner: OWNER, name: 'app:unused', contextDir: context, buildArgs: { UNUSED: 'y' } });
      expect(unused.layer).toBe(back.layer);
    } finally {
      await writeFile(join(context, 'config.txt'), 'setting=1\n');
    }
  });

  it('keeps one tenant\'s cache from answering another tenant\'s build', async () => {
    const mine = await service.resolve(OWNER, 'app:v1');
    const other = await service.build({ owner: 'other-tenant', name: 'app:v1', contextDir: context });
    expect(other.layer).not.toBe(mine.layer);
    await expect(service.resolve('other-tenant', mine.id)).rejects.toMatchObject({ code: 'TEMPLATE_NOT_FOUND' });
    await service.remove('other-tenant', 'app');
  });

  it('a missing COPY source is INVALID_ARGUMENT with its line, before anything is made', async () => {
    const dir = await dockerfileContext({ Dockerfile: `FROM ${TEST_DEBIAN}\nENV A=1\nCOPY missing.txt /opt/\n` });
    try {
      const before = await layerKeys();
      const error = await buildError(service.build({ owner: OWNER, name: 'broken', contextDir: dir }));
      expect(error.code).toBe('INVALID_ARGUMENT');
      expect(error.message).toBe(`Dockerfile:3: COPY source "missing.txt" is not in the build context (${dir})`);
      expect(await layerKeys()).toEqual(before);
      expect(await service.store.find(OWNER, 'broken')).toBeUndefined();
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('cancelled mid-build, it leaves no layer, pending snapshot or temp, and says ABORTED', async () => {
    const dir = await dockerfileContext({ Dockerfile: `FROM ${TEST_DEBIAN}\nCOPY small.txt /opt/\nCOPY big.bin /opt/\n`, 'small.txt': 'x\n', 'big.bin': 'y'.repeat(16 * 1024 * 1024) });
    const controller = new AbortController();
    try {
      const before = await layerKeys();
      const error = await buildError(
        service.build({ owner: OWNER, name: 'cancelled', contextDir: dir, noCache: true, signal: controller.signal, onLog: (e) => e.message.startsWith('step 2/') && controller.abort() }),
      );
      expect(error.code).toBe('ABORTED');
      const after = await layerKeys();
      // Step 1 finished before the cancel and stays as a cache layer only if published; step 2 left nothing.
      expect(after.filter((k) => !before.includes(k)).length).toBeLessThanOrEqual(1);
      expect(await service.layers.pending()).toEqual([]);
      expect(await service.store.find(OWNER, 'cancelled')).toBeUndefined();
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('FROM scratch builds a root of only what it copies', async () => {
    const dir = await dockerfileContext({ Dockerfile: 'FROM scratch\nCOPY hello /hello\nENTRYPOINT ["/hello"]\n', hello: '#!/bin/sh\n' });
    try {
      const template = await service.build({ owner: OWNER, name: 'tiny-scratch', contextDir: dir });
      expect(template.parent).toEqual({ kind: 'scratch' });
      expect(template.config).toEqual({ env: {}, workdir: '/', user: 'root', startCmd: '/hello' });
      const root = service.layers.rootOf(template.layer);
      expect(await readdir(root)).toEqual(['hello']);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('writes only inside the template: symlinks in the template or the context never lead to host files', async () => {
    const marker = `capsule-escape-${process.pid}`;
    const dir = await dockerfileContext({
      Dockerfile: `FROM ${TEST_DEBIAN}\nCOPY links/ /app/\nCOPY payload.txt /app/abs/${marker}\nCOPY payload.txt /app/rel/${marker}\nCOPY hostfile /copied-link\n`,
      'payload.txt': 'payload\n',
    });
    await mkdir(join(dir, 'links'));
    await symlink('/etc', join(dir, 'links/abs'));
    await symlink('../../../../../../../../etc', join(dir, 'links/rel'));
    await symlink('/etc/hostname', join(dir, 'hostfile'));
    try {
      const template = await service.build({ owner: OWNER, name: 'links', contextDir: dir });
      const root = service.layers.rootOf(template.layer);
      await expect(lstat(join('/etc', marker))).rejects.toMatchObject({ code: 'ENOENT' });
      expect(await readFile(join(root, 'etc', marker), 'utf8')).toBe('payload\n');
      expect(await readlink(join(root, 'copied-link'))).toBe('/etc/hostname');
      expect((await lstat(join(root, 'copied-link'))).isSymbolicLink()).toBe(true);
    } finally {
      await rm(dir, { recursive: true, force: true });
      await rm(join('/etc', marker), { force: true });
    }
  });

  it('refuses a COPY source through a symlinked directory, ADD of an archive, and an unknown --chown user', async () => {
    const dir = await dockerfileContext({ 'real/file': 'x\n' });
    await writeFile(join(dir, 'a.tar.gz'), Buffer.from([0x1f, 0x8b, 0x08, 0x00, 0x72, 0x65, 0x73, 0x74]));
    await symlink('real', join(dir, 'linked'));
    try {
      await writeFile(join(dir, 'Dockerfile'), `FROM ${TEST_DEBIAN}\nCOPY linked/file /x\n`);
      expect((await buildError(service.build({ owner: OWNER, name: 'refused', contextDir: dir }))).message).toMatch(/^Dockerfile:2: COPY source "linked\/file" goes through a symbolic link/);
      await writeFile(join(dir, 'Dockerfile'), `FROM ${TEST_DEBIAN}\nADD a.tar.gz /x/\n`);
      expect((await buildError(service.build({ owner: OWNER, name: 'refused', contextDir: dir }))).message).toMatch(/^Dockerfile:2: ADD of the archive "a.tar.gz" is not supported/);
      await writeFile(join(dir, 'Dockerfile'), `FROM ${TEST_DEBIAN}\nCOPY --chown=nobody-here real/file /x\n`);
      const chown = await buildError(service.build({ owner: OWNER, name: 'refused', contextDir: dir }));
      expect(chown.message).toBe('Dockerfile:2: --chown=nobody-here: user "nobody-here" is not in the template\'s /etc/passwd');
      expect(await service.store.find(OWNER, 'refused')).toBeUndefined();
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});

describe('buildTemplate (the one entry point for servers and the CLI)', () => {
  it('builds a Dockerfile given as text, with a start and a ready command, streaming its log', async () => {
    const dir = await dockerfileContext({ 'hello.txt': 'hi\n' });
    try {
      const logs: string[] = [];
      const template = await service.buildTemplate({
        owner: OWNER,
        name: 'texted:v1',
        tags: ['stable'],
        source: { kind: 'dockerfile', contextDir: dir, dockerfileText: `FROM ${TEST_DEBIAN}\nCOPY hello.txt /srv/\nCMD ["cat", "/srv/hello.txt"]\n` },
        config: { readyCmd: 'test -s /srv/hello.txt' },
        onLog: (entry) => logs.push(entry.message),
      });
      expect(template).toMatchObject({ name: 'texted', tags: ['stable', 'v1'], source: 'dockerfile' });
      expect(template.config).toMatchObject({ startCmd: 'cat /srv/hello.txt', readyCmd: 'test -s /srv/hello.txt', user: 'user' });
      expect(await readFile(join(service.layers.rootOf(template.layer), 'srv/hello.txt'), 'utf8')).toBe('hi\n');
      expect(logs).toContain('step 1/2: COPY hello.txt /srv/');
      expect((await service.resolve(OWNER, 'texted:stable')).id).toBe(template.id);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('refuses a bad request before anything is made', async () => {
    const before = await layerKeys();
    await expect(service.buildTemplate({ owner: OWNER, name: 'bad', source: { kind: 'dockerfile', contextDir: context, limits: { pids: 1 } } })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    await expect(service.buildTemplate({ owner: OWNER, name: 'Bad Name', source: { kind: 'dockerfile', contextDir: context } })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    expect(await layerKeys()).toEqual(before);
  });
});

describe('RUN steps through the StepRunner seam (the engine\'s, recorded)', () => {
  it('runs a RUN in a sandbox from the parent layer as root, publishes the result, and takes it from the cache next time', async () => {
    const dir = await dockerfileContext({ Dockerfile: `FROM ${TEST_DEBIAN}\nENV WHO=capsule\nRUN echo "built by $WHO" > /built.txt && id -u > /uid.txt\n` });
    try {
      const calls = runner.steps.length;
      const template = await service.build({ owner: OWNER, name: 'ran', contextDir: dir });
      expect(runner.steps.length).toBe(calls + 1);
      const step = runner.steps.at(-1)!;
      expect(step).toMatchObject({ argv: ['/bin/sh', '-c', 'echo "built by $WHO" > /built.txt && id -u > /uid.txt'], user: 'root', cwd: '/home/user' });
      expect(step.env).toMatchObject({ WHO: 'capsule' });
      // ENV makes no layer: the step's sandbox is made from the base template's layer itself.
      expect(step.layerDir).toBe(service.layers.rootOf((await service.resolve(OWNER, TEST_DEBIAN)).layer));
      expect(step.network).toMatchObject({ mode: 'allowlist' });
      expect((step.network.allow ?? []).length).toBeGreaterThan(0);
      const root = service.layers.rootOf(template.layer);
      expect(await readFile(join(root, 'built.txt'), 'utf8')).toBe('built by capsule\n');
      expect(await readFile(join(root, 'uid.txt'), 'utf8')).toBe('0\n');
      const again = await service.build({ owner: OWNER, name: 'ran', contextDir: dir });
      expect(again.layer).toBe(template.layer);
      expect(runner.steps.length).toBe(calls + 1);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('a failing RUN is BUILD_FAILED with its line, exit code and last lines; nothing of it remains', async () => {
    const dir = await dockerfileContext({ Dockerfile: `FROM ${TEST_DEBIAN}\n\nRUN echo working; echo about to fail >&2; exit 3\n` });
    try {
      const before = await layerKeys();
      const error = await buildError(service.build({ owner: OWNER, name: 'failing', contextDir: dir }));
      expect(error.code).toBe('BUILD_FAILED');
      expect(error.message).toBe('Dockerfile:3: RUN failed with exit code 3: about to fail');
      expect(error.details).toMatchObject({ step: '1', line: 3, exitCode: 3, lastLines: expect.arrayContaining(['working', 'about to fail']) as unknown });
      expect(await layerKeys()).toEqual(before);
      const builds = await service.store.list(OWNER);
      expect(builds.find((t) => t.name === 'failing')).toBeUndefined();
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('without a runtime, an uncached RUN is UNIMPLEMENTED and leaves nothing', async () => {
    const bare = testTemplates();
    const dir = await dockerfileContext({ Dockerfile: `FROM ${TEST_DEBIAN}\nRUN true\n` });
    try {
      const error = await buildError(bare.build({ owner: OWNER, name: 'no-runtime', contextDir: dir }));
      expect(error.code).toBe('UNIMPLEMENTED');
      expect(error.message).toMatch(/^Dockerfile:2: RUN steps need Capsule's template runtime/);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});
