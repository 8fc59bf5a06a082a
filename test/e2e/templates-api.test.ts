import { Sandbox as E2bSandbox } from 'e2b';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BuildFailedError, PermissionDeniedError, Sandbox, Template, TemplateNotFoundError, type BuildLogEntry } from '../../src/sdk/index.js';
import { expectNoLeaks } from '../helpers/sandbox.js';
import { sharedDebianTemplate, TEST_DEBIAN, testTemplates } from '../helpers/templates.js';
import { startE2bServer, type E2bTestServer } from './e2b-harness.js';

/**
 * Templates over the API with two real tenants: a tenant builds a Dockerfile FROM the operator's
 * public Debian template (the run's shared one) with its context sent inline, gets its log line
 * by line, runs sandboxes from it through the Capsule SDK and the official E2B SDK; the other
 * tenant sees the public template but never the first one's. Bad builds end with a stable code.
 */
let t: E2bTestServer;
let alice: string;
let bob: string;

const b64 = (text: string) => Buffer.from(text).toString('base64');
const as = (apiKey: string) => ({ url: t.url, apiKey });
const e2bAs = (apiKey: string) => ({ ...t.opts, apiKey: `e2b_${apiKey.slice('cap_'.length)}` });

beforeAll(async () => {
  // Made once per test run (a Debian bootstrap takes minutes) and shared with other files.
  await sharedDebianTemplate(testTemplates());
  t = await startE2bServer();
  const mint = async (tenantId: string) => (await t.json<{ apiKey: string }>('POST', '/v1/keys', { body: { tenantId } })).body.apiKey;
  [alice, bob] = [await mint('tpl-alice'), await mint('tpl-bob')];
}, 30 * 60_000);

afterAll(async () => {
  await t?.server.close();
  await expectNoLeaks();
});

const APP_DOCKERFILE = [
  `FROM ${TEST_DEBIAN}`,
  'COPY hello.txt /opt/hello.txt',
  'COPY bin/greet /usr/local/bin/greet',
  'RUN cp /opt/hello.txt /opt/copied && chown user:user /opt/copied',
  'ENV GREETING=hi',
  '',
].join('\n');
const APP_FILES = [
  { path: 'hello.txt', data: b64('hello from the context\n') },
  { path: 'bin/greet', data: b64('#!/bin/sh\necho "$GREETING from $(id -un)"\n'), mode: 0o755 },
];

describe('templates over the API, two tenants', () => {
  it('builds a Dockerfile with an inline context, streams its log, runs it from both SDKs, and keeps it from the other tenant', async () => {
    const log: BuildLogEntry[] = [];
    const built = await Template.build({ name: 'app', source: { kind: 'dockerfile', dockerfile: APP_DOCKERFILE, files: APP_FILES } }, { ...as(alice), onLog: (entry) => log.push(entry) });
    expect(built).toMatchObject({ name: 'app', tags: ['latest'], public: false, source: 'dockerfile', parent: { kind: 'template', name: TEST_DEBIAN } });
    expect(built.config.env.GREETING).toBe('hi');
    // Step by step, live: the RUN step's own line is among them.
    expect(log.some((entry) => entry.message.includes('RUN cp /opt/hello.txt'))).toBe(true);

    // Alice sees hers and the public one; Bob only the public one, and hers is not found for him.
    expect((await Template.list(as(alice))).map((x) => x.name)).toEqual(expect.arrayContaining(['app', TEST_DEBIAN]));
    const bobs = (await Template.list(as(bob))).map((x) => x.name);
    expect(bobs).toContain(TEST_DEBIAN);
    expect(bobs).not.toContain('app');
    await expect(Template.get('app', as(bob))).rejects.toBeInstanceOf(TemplateNotFoundError);
    await expect(Sandbox.create({ template: 'app' }, as(bob))).rejects.toBeInstanceOf(TemplateNotFoundError);
    await expect(E2bSandbox.create('app', e2bAs(bob))).rejects.toThrow(/no template named "app"/);

    const sandbox = await Sandbox.create({ template: 'app' }, as(alice));
    try {
      const run = await sandbox.commands.run(['sh', '-c', 'cat /opt/copied; greet; stat -c %U /opt/copied']);
      expect(run).toMatchObject({ outcome: 'ok', stdout: 'hello from the context\nhi from user\nuser\n' });
    } finally {
      await sandbox.kill();
    }
    const e2b = await E2bSandbox.create('app', e2bAs(alice));
    try {
      const run = await e2b.commands.run('greet && whoami');
      expect(run.stdout).toBe('hi from user\nuser\n');
      const root = await e2b.commands.run('id -u', { user: 'root' });
      expect(root.stdout).toBe('0\n');
    } finally {
      await e2b.kill();
    }

    // Unchanged, it builds from the cache: every step a hit, the same template id.
    const again = await Template.build({ name: 'app', source: { kind: 'dockerfile', dockerfile: APP_DOCKERFILE, files: APP_FILES } }, as(alice));
    const build = await Template.getBuild(again.buildId, as(alice));
    expect(build.status).toBe('ready');
    expect(build.steps.filter((s) => s.step !== 'base').every((s) => s.cached)).toBe(true);

    expect(await Template.delete('app', as(alice))).toEqual([again.id]);
    await expect(Template.get('app', as(alice))).rejects.toBeInstanceOf(TemplateNotFoundError);
  });

  it('ends a failing RUN, and a missing COPY source with stable codes, and refuses a tenant a public build', async () => {
    const failing = Template.build({ name: 'bad', source: { kind: 'dockerfile', dockerfile: `FROM ${TEST_DEBIAN}\nRUN echo about to fail >&2 && exit 7\n` } }, as(alice));
    await expect(failing).rejects.toBeInstanceOf(BuildFailedError);
    await expect(failing).rejects.toMatchObject({ details: { line: 2, exitCode: 7 } });
    await expect(Template.build({ name: 'bad', source: { kind: 'dockerfile', dockerfile: `FROM ${TEST_DEBIAN}\nCOPY missing.txt /x\n` } }, as(alice))).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    await expect(Template.build({ name: 'pub', public: true, source: { kind: 'dockerfile', dockerfile: `FROM ${TEST_DEBIAN}\n` } }, as(alice))).rejects.toBeInstanceOf(PermissionDeniedError);
    // None of them left a template behind.
    expect((await Template.list(as(alice))).map((x) => x.name)).not.toContain('bad');
  });
});
