import { randomBytes } from 'node:crypto';
import { request as httpRequest } from 'node:http';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BuildError, Sandbox, Template, type LogEntry } from 'e2b';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { expectNoLeaks } from '../helpers/sandbox.js';
import { sharedDebianTemplate, TEST_DEBIAN, testTemplates } from '../helpers/templates.js';
import { startE2bServer, type E2bTestServer } from './e2b-harness.js';

/**
 * The official E2B SDK's own Template.build(), unmodified, against Capsule: a template FROM the
 * run's shared Debian template with a copy, run steps (as the template's user and as root) and an
 * env; the SDK polls the build with its log and then Sandbox.create(name) runs it. A failing step
 * ends in the SDK's BuildError with the step's output; what a build cannot do is refused by name;
 * two tenants never see each other's templates, builds or upload URLs.
 */
let t: E2bTestServer;
let context: string;
let alice: E2bTestServer['opts'];
let bob: E2bTestServer['opts'];
const NAME = 'e2b-app';

beforeAll(async () => {
  await sharedDebianTemplate(testTemplates());
  t = await startE2bServer();
  const mint = async (tenantId: string) => {
    const key = (await t.json<{ apiKey: string }>('POST', '/v1/keys', { body: { tenantId } })).body.apiKey;
    return { ...t.opts, apiKey: `e2b_${key.slice('cap_'.length)}` };
  };
  [alice, bob] = [await mint('e2bt-alice'), await mint('e2bt-bob')];
  context = await mkdtemp(join(tmpdir(), 'capsule-e2b-template-'));
  await writeFile(join(context, 'hello.txt'), 'hello from the SDK\n');
}, 30 * 60_000);

afterAll(async () => {
  await t?.server.close();
  if (context) await rm(context, { recursive: true, force: true });
  await expectNoLeaks();
});

const appTemplate = () =>
  Template({ fileContextPath: context })
    .fromTemplate(TEST_DEBIAN)
    .copy('hello.txt', '/opt/hello.txt')
    .runCmd('cp /opt/hello.txt /opt/copied && id -u > /opt/builder-uid', { user: 'root' })
    .runCmd('whoami > step-user && pwd > step-dir')
    .setEnvs({ GREETING: 'hi from env' })
    .setEnvs({ EXTENDED: '$GREETING too' });

describe("the E2B SDK's Template.build", () => {
  it('builds from the shared Debian template with copy, run and env steps, logs them, and Sandbox.create(name) runs it', async () => {
    const logs: LogEntry[] = [];
    const built = await Template.build(appTemplate(), `${NAME}:v1`, { ...alice, onBuildLogs: (entry) => logs.push(entry) });
    expect(built).toMatchObject({ name: `${NAME}:v1`, templateId: NAME, tags: ['v1'] });
    const messages = logs.map((entry) => entry.message);
    expect(messages).toContain("Uploaded 'hello.txt'");
    // The build's own lines, polled from the server: the steps by E2B's numbers.
    expect(messages.some((m) => m.includes('RUN cp /opt/hello.txt'))).toBe(true);

    const sandbox = await Sandbox.create(`${NAME}:v1`, alice);
    try {
      const files = await sandbox.commands.run('cat /opt/copied /opt/builder-uid /home/user/step-user /home/user/step-dir && echo "$GREETING / $EXTENDED" && whoami');
      expect(files.stdout).toBe('hello from the SDK\n0\nuser\n/home/user\nhi from env / hi from env too\nuser\n');
      const root = await sandbox.commands.run('id -u && touch /etc/capsule-root-was-here', { user: 'root' });
      expect(root.stdout).toBe('0\n');
    } finally {
      await sandbox.kill();
    }

    // Unchanged: the files are not sent again and every step comes from Capsule's cache.
    const again: LogEntry[] = [];
    await Template.build(appTemplate(), `${NAME}:v1`, { ...alice, onBuildLogs: (entry) => again.push(entry) });
    expect(again.map((entry) => entry.message)).toContain("Skipping upload of 'hello.txt', already cached");
    const capsuleKey = `cap_${alice.apiKey.slice('e2b_'.length)}`;
    const info = await t.json<{ buildId: string }>('GET', `/v1/templates/${NAME}:v1`, { key: capsuleKey });
    const build = await t.json<{ steps: { step: string; cached: boolean }[] }>('GET', `/v1/templates/builds/${info.body.buildId}`, { key: capsuleKey });
    expect(build.body.steps.filter((s) => s.step !== 'base').map((s) => s.cached)).toEqual([true, true, true, true, true]);
  });

  it("keeps a tenant's templates, builds and upload links from another tenant", async () => {
    expect(await Template.exists(NAME, alice)).toBe(true);
    expect(await Template.exists(NAME, bob)).toBe(false);
    expect(await Template.exists(TEST_DEBIAN, bob)).toBe(true);
    await expect(Sandbox.create(`${NAME}:v1`, bob)).rejects.toThrow(/no template named/);
    // Alice's build, asked for by Bob: not found, as if it did not exist.
    const mine = await Template.buildInBackground(Template().fromTemplate(TEST_DEBIAN).setEnvs({ X: '1' }), `${NAME}:bg`, alice);
    await expect(Template.getBuildStatus(mine, bob)).rejects.toThrow(/404/);
    const status = await Template.getBuildStatus(mine, alice);
    expect(['building', 'ready']).toContain(status.status);
    const link = await fetch(`${t.url}/templates/${NAME}/files/${'a'.repeat(64)}`, { headers: { 'x-api-key': bob.apiKey } });
    expect(link.status).toBe(404);
  });

  it('signs upload URLs for one tenant and file, and bounds uploads in size', async () => {
    const { body: requested } = await t.json<{ templateID: string }>('POST', '/v3/templates', { key: null, headers: { 'x-api-key': alice.apiKey }, body: { name: `${NAME}-up` } });
    const hash = randomBytes(32).toString('hex');
    const link = await (await fetch(`${t.url}/templates/${requested.templateID}/files/${hash}`, { headers: { 'x-api-key': alice.apiKey } })).json() as { present: boolean; url: string };
    expect(link.present).toBe(false);
    // Another hash or tenant under the same signature, or no signature, is refused.
    for (const forged of [link.url.replace(hash, 'b'.repeat(64)), link.url.replace('/e2bt-alice/', '/e2bt-bob/'), link.url.split('?')[0]!]) {
      expect((await fetch(forged, { method: 'PUT', body: 'x' })).status).toBe(401);
    }
    // A declared size past the bound is refused before anything is stored.
    const status = await new Promise<number>((resolve, reject) => {
      const req = httpRequest(link.url, { method: 'PUT', headers: { 'content-length': String(300 * 1024 * 1024) } }, (res) => {
        res.resume();
        resolve(res.statusCode ?? 0);
        req.destroy();
      });
      req.on('error', reject);
      req.write(Buffer.alloc(1024));
    });
    expect(status).toBe(413);
    const after = await (await fetch(`${t.url}/templates/${requested.templateID}/files/${hash}`, { headers: { 'x-api-key': alice.apiKey } })).json() as { present: boolean };
    expect(after.present).toBe(false);
  });

  it("ends a failing step in the SDK's BuildError with the step's output, and refuses what a build cannot do by name", async () => {
    const logs: LogEntry[] = [];
    const failing = Template().fromTemplate(TEST_DEBIAN).setEnvs({ A: 'b' }).runCmd('echo doomed-output-line && exit 3');
    const error = await Template.build(failing, `${NAME}-bad`, { ...alice, onBuildLogs: (entry) => logs.push(entry) }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(BuildError);
    expect((error as Error).message).toMatch(/^step:2: RUN failed with exit code 3: doomed-output-line/);
    expect(logs.map((entry) => entry.message)).toContain('doomed-output-line');
    expect(await Template.exists(`${NAME}-bad`, alice)).toBe(false);

    const pip = Template().fromTemplate(TEST_DEBIAN).pipInstall('requests');
    await expect(Template.build(pip, `${NAME}-pip`, alice)).rejects.toThrow(/pipInstall .*needs PyPI/);
    const creds = Template().fromImage('registry.invalid/x:1', { username: 'u', password: 'p' });
    await expect(Template.build(creds, `${NAME}-creds`, alice)).rejects.toThrow(/registry credentials are the operator's/);
    await expect(Template.build(Template().fromTemplate(TEST_DEBIAN), 'base', alice)).rejects.toThrow(/E2B's default template names/);
    // A missing template base is not found, and never taken for an image to pull.
    await expect(Template.build(Template().fromTemplate('no-such-template'), `${NAME}-nobase`, alice)).rejects.toThrow(/404: no template named "no-such-template"/);
  });
});
