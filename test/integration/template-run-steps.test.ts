import { lstat, mkdir, mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { isSandboxError, type SandboxError } from '../../src/errors/index.js';
import { SandboxStepRunner } from '../../src/engine/build-step-runner.js';
import { Runner } from '../../src/engine/runner.js';
import { StoredTemplates } from '../../src/engine/stored-templates.js';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import type { TemplateService } from '../../src/templates/template-service.js';
import { describeResult, expectNoLeaks, testDataDir } from '../helpers/sandbox.js';
import { sharedDebianTemplate, testTemplates, TEST_DEBIAN } from '../helpers/templates.js';

/** The one-shot runner's tenant: templates it runs are this tenant's (or public). */
const OWNER = 'local';
let steps: SandboxStepRunner;
let service: TemplateService;
let runner: Runner;
const contexts: string[] = [];

beforeAll(async () => {
  steps = new SandboxStepRunner({ host: new HostEnvironment({ dataDir: testDataDir() }) });
  service = testTemplates({ stepRunner: steps });
  await sharedDebianTemplate(service);
  runner = new Runner({ dataDir: testDataDir(), templates: new StoredTemplates(service) });
}, 20 * 60_000);
afterAll(async () => {
  await runner?.close();
  await steps?.close();
  for (const dir of contexts) await rm(dir, { recursive: true, force: true });
});
afterEach(expectNoLeaks);

async function context(dockerfile: string, files: Record<string, string> = {}): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'capsule-runctx-'));
  contexts.push(dir);
  await writeFile(join(dir, 'Dockerfile'), dockerfile);
  for (const [name, content] of Object.entries(files)) {
    await mkdir(join(dir, name, '..'), { recursive: true });
    await writeFile(join(dir, name), content);
  }
  return dir;
}

async function buildError(promise: Promise<unknown>): Promise<SandboxError> {
  const error = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  if (!isSandboxError(error)) throw new Error(`expected a SandboxError, got ${String(error)}`);
  return error;
}

describe('RUN steps in Capsule sandboxes (the engine\'s StepRunner)', () => {
  it('runs RUN as root in a user namespace: chown works, raw ids land on disk, the layer keeps only what the step wrote', async () => {
    const dir = await context(
      `FROM ${TEST_DEBIAN}\nCOPY hello.txt /opt/hello.txt\nRUN id -u > /opt/uid && touch /opt/owned && chown user:user /opt/owned && mkdir -p /var/lib/app && chmod 2775 /var/lib/app\nUSER user\nRUN id -un > /home/user/whoami\nCMD ["cat", "/opt/hello.txt"]\n`,
      { 'hello.txt': 'hello from a built template\n' },
    );
    const logs: string[] = [];
    const template = await service.build({ owner: OWNER, name: 'built:v1', contextDir: dir, onLog: (e) => logs.push(`${e.step} ${e.message}`) });
    const root = service.layers.rootOf(template.layer);
    expect(await readFile(join(root, 'opt/uid'), 'utf8')).toBe('0\n');
    const owned = await stat(join(root, 'opt/owned'));
    expect([owned.uid, owned.gid]).toEqual([1000, 1000]);
    expect((await stat(join(root, 'var/lib/app'))).mode & 0o7777).toBe(0o2775);
    // A RUN after USER runs as that user: its file is the user's on disk.
    expect(await readFile(join(root, 'home/user/whoami'), 'utf8')).toBe('user\n');
    expect((await stat(join(root, 'home/user/whoami'))).uid).toBe(1000);
    // What the runtime put into the step's root is not part of the layer.
    for (const mark of ['workspace', '.capsule']) await expect(lstat(join(root, mark)), mark).rejects.toMatchObject({ code: 'ENOENT' });
    // The parent layer is as it was.
    const base = service.layers.rootOf((await service.resolve(OWNER, TEST_DEBIAN)).layer);
    await expect(lstat(join(base, 'opt/uid'))).rejects.toMatchObject({ code: 'ENOENT' });
    expect(logs.some((l) => l.startsWith('2 step 2/5: RUN'))).toBe(true);
    expect(template.config.startCmd).toBe('cat /opt/hello.txt');
  });

  it('the built template runs in a sandbox as its user, with its files', async () => {
    const result = await runner.run(['sh', '-c', 'id -u; cat /opt/hello.txt; stat -c %U /opt/owned'], { spec: { template: 'built:v1' } });
    expect(result.outcome, describeResult(result)).toBe('ok');
    expect(result.stdout).toBe('1000\nhello from a built template\nuser\n');
  });

  it('an unchanged rebuild starts no sandbox: the RUN comes from the cache', async () => {
    const dir = contexts[0]!;
    const before = (await service.layers.list()).length;
    const again = await service.build({ owner: OWNER, name: 'built:v1', contextDir: dir });
    expect((await service.getBuild(OWNER, again.buildId))!.steps.every((s) => s.cached)).toBe(true);
    expect((await service.layers.list()).length).toBe(before);
  });

  it('a failing RUN reports its line, exit code and last lines; its sandbox and snapshot are gone', async () => {
    const dir = await context(`FROM ${TEST_DEBIAN}\nRUN echo preparing && ls /no/such/dir\n`);
    const error = await buildError(service.build({ owner: OWNER, name: 'fails', contextDir: dir }));
    expect(error.code).toBe('BUILD_FAILED');
    expect(error.message).toMatch(/^Dockerfile:2: RUN failed with exit code 2: ls: cannot access '\/no\/such\/dir': No such file or directory$/);
    expect(error.details).toMatchObject({ step: '1', line: 2, exitCode: 2 });
    expect((error.details as { lastLines: string[] }).lastLines).toContain('preparing');
  });

  it('a RUN past its wall clock is stopped and reported as that limit', async () => {
    const dir = await context(`FROM ${TEST_DEBIAN}\nRUN sleep 60\n`);
    const error = await buildError(service.build({ owner: OWNER, name: 'slow', contextDir: dir, limits: { wallClockMs: 1000 } }));
    expect(error.code).toBe('BUILD_FAILED');
    expect(error.message).toBe('Dockerfile:2: RUN stopped by the wall_clock limit');
  });

  it('cancelled during a RUN, the step\'s sandbox is destroyed and nothing is left', async () => {
    const dir = await context(`FROM ${TEST_DEBIAN}\nRUN echo started && sleep 60\n`);
    const controller = new AbortController();
    const error = await buildError(service.build({ owner: OWNER, name: 'cancelled-run', contextDir: dir, signal: controller.signal, onLog: (e) => e.message === 'started' && controller.abort() }));
    expect(error.code).toBe('ABORTED');
    expect(await service.layers.pending()).toEqual([]);
  });

  it('installs a Debian package the host lacks through the default build network (the host\'s apt sources only)', async () => {
    // apt is told to stay root: it otherwise fetches as _apt, which cannot write the runtime's /tmp
    // (a tmpfs of mode 0755 in sandboxes from templates; reported to the lead: bwrap's --perms 1777).
    const dir = await context(`FROM ${TEST_DEBIAN}\nRUN apt-get -o APT::Sandbox::User=root update && DEBIAN_FRONTEND=noninteractive apt-get -o APT::Sandbox::User=root install -y --no-install-recommends figlet\n`);
    const template = await service.build({ owner: OWNER, name: 'figlet', contextDir: dir, limits: { wallClockMs: 15 * 60_000, memoryBytes: 1024 * 1024 * 1024, diskBytes: 2 * 1024 ** 3 } });
    const result = await runner.run(['figlet', 'ok'], { spec: { template: 'figlet' } });
    expect(result.outcome, describeResult(result)).toBe('ok');
    expect(result.stdout.length).toBeGreaterThan(10);
    // A step's grant reaches only the apt mirrors: anything else is refused by the egress proxy.
    const other = await context(`FROM figlet\nRUN curl -sS --max-time 20 -o /dev/null https://example.com/\n`);
    const refused = await buildError(service.build({ owner: OWNER, name: 'no-npm', contextDir: other }));
    expect(refused.code).toBe('BUILD_FAILED');
    expect(refused.message).toMatch(/^Dockerfile:2: RUN failed with exit code \d+: curl: \(\d+\)/);
    expect(template.layer).not.toBe((await service.resolve(OWNER, TEST_DEBIAN)).layer);
  }, 20 * 60_000);
});
