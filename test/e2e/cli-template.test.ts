import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli } from '../helpers/cli.js';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';
import { sharedDebianTemplate, TEST_DEBIAN, testTemplates } from '../helpers/templates.js';
import { startTestServer, type TestServer } from './server-helpers.js';

/**
 * `capsule template` on the local data directory (no server named: the operator's public
 * templates, RUN steps in local sandboxes) and on a server (`CAPSULE_URL`, a tenant's own).
 */
let context: string;
let t: TestServer;

beforeAll(async () => {
  await sharedDebianTemplate(testTemplates());
  context = await mkdtemp(join(tmpdir(), 'capsule-cli-template-'));
  await writeFile(join(context, 'Dockerfile'), `FROM ${TEST_DEBIAN}\nARG WHO=nobody\nCOPY note.txt /opt/note.txt\nRUN echo "built for $WHO" >> /opt/note.txt\n`);
  await writeFile(join(context, 'note.txt'), 'from the context\n');
  t = await startTestServer();
}, 30 * 60_000);

afterAll(async () => {
  await t?.server.close();
  await rm(context, { recursive: true, force: true });
  await expectNoLeaks();
});

describe('capsule template', () => {
  it('builds, lists, inspects and removes a template on the local data directory', async () => {
    const local = { CAPSULE_URL: undefined };
    const dataDir = ['--data-dir', testDataDir()];
    const built = await runCli(['template', 'build', context, '-t', 'cli-local', '--build-arg', 'WHO=cli', '--json', ...dataDir], local);
    expect(built.stderr).toBe('');
    expect(JSON.parse(built.stdout)).toMatchObject({ name: 'cli-local', public: true, source: 'dockerfile' });
    const list = JSON.parse((await runCli(['template', 'ls', '--json', ...dataDir], local)).stdout) as { templates: { name: string }[] };
    expect(list.templates.map((x) => x.name)).toEqual(expect.arrayContaining(['cli-local', TEST_DEBIAN]));
    expect(JSON.parse((await runCli(['template', 'inspect', 'cli-local', ...dataDir], local)).stdout)).toMatchObject({ parent: { kind: 'template', name: TEST_DEBIAN } });
    // What the build made: the server's sandboxes (any tenant: it is public) start from it.
    const run = await runCli(['sandbox', 'create', '--template', 'cli-local', '--timeout', '2m'], { CAPSULE_URL: t.url, CAPSULE_API_KEY: t.apiKey });
    const id = run.stdout.trim();
    try {
      expect((await runCli(['sandbox', 'exec', id, '--', 'cat', '/opt/note.txt'], { CAPSULE_URL: t.url, CAPSULE_API_KEY: t.apiKey })).stdout).toBe('from the context\nbuilt for cli\n');
    } finally {
      await runCli(['sandbox', 'kill', id], { CAPSULE_URL: t.url, CAPSULE_API_KEY: t.apiKey });
    }
    expect((await runCli(['template', 'rm', 'cli-local', ...dataDir], local)).code).toBe(0);
    const unknown = await runCli(['template', 'inspect', 'cli-local', ...dataDir], local);
    expect(unknown.code).not.toBe(0);
    expect(unknown.stderr).toMatch(/TEMPLATE_NOT_FOUND/);
  });

  it('builds on a server named by CAPSULE_URL, with the context sent inline, as the key\'s tenant', async () => {
    const remote = { CAPSULE_URL: t.url, CAPSULE_API_KEY: t.apiKey };
    const built = await runCli(['template', 'build', context, '-t', 'cli-remote', '--json'], remote);
    expect(JSON.parse(built.stdout)).toMatchObject({ name: 'cli-remote', public: false });
    const list = JSON.parse((await runCli(['template', 'ls', '--json'], remote)).stdout) as { templates: { name: string }[] };
    expect(list.templates.map((x) => x.name)).toContain('cli-remote');
    expect((await runCli(['template', 'rm', 'cli-remote'], remote)).code).toBe(0);
  });
});
