import { mkdtemp, readFile, readlink, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { gzipSync } from 'node:zlib';
import { afterEach, describe, expect, it } from 'vitest';
import { entryHeader, tarStream, type TarEntry } from '../../src/engine/changes/tar.js';
import { SandboxError } from '../../src/errors/index.js';
import { TemplateFiles } from '../../src/server/e2b/template-files.js';
import { E2bTemplateBuilds, type E2bBuild } from '../../src/server/e2b/template-jobs.js';
import type { LogEntry } from '../../src/templates/build-log.js';
import { translateTemplate } from '../../src/server/e2b/template-steps.js';
import { planBuild, type BuildBase } from '../../src/templates/builder/plan.js';
import { BuildContext } from '../../src/templates/dockerfile/context.js';
import { unpackContextTar } from '../../src/templates/dockerfile/context-tar.js';

const HASH = 'a'.repeat(64);
const dirs: string[] = [];
const tempDir = async () => {
  const dir = await mkdtemp(join(tmpdir(), 'capsule-e2b-steps-'));
  dirs.push(dir);
  return dir;
};
afterEach(async () => {
  for (const dir of dirs.splice(0)) await rm(dir, { recursive: true, force: true });
});

const file = (name: string, text: string, mode = 0o644): TarEntry => ({ name, type: 'file', mode, size: Buffer.byteLength(text), body: () => Promise.resolve(Readable.from([Buffer.from(text)])) });
const tarOf = async (entries: TarEntry[]) => Buffer.concat(await tarStream(entries).toArray());

describe("E2B's template steps as Capsule instructions", () => {
  it('maps each step one for one after FROM, so the step numbers are E2B\'s', () => {
    const t = translateTemplate({
      fromTemplate: 'test-debian',
      steps: [
        { type: 'COPY', args: ['app/*.txt', '/opt/app/', 'user', '0640'], filesHash: HASH },
        { type: 'RUN', args: ['apt-get update && apt-get install -y figlet', 'root'], force: true },
        { type: 'ENV', args: ['A', 'one two', 'B', '$A!'] },
        { type: 'WORKDIR', args: ['/srv/$HOME'] },
        { type: 'USER', args: ['user'] },
      ],
      startCmd: 'sleep infinity',
      readyCmd: 'true',
      force: true,
    });
    expect(t.from).toBe('test-debian');
    expect(t.instructions.map((i) => [i.kind, i.line])).toEqual([['FROM', 0], ['COPY', 1], ['RUN', 2], ['ENV', 3], ['WORKDIR', 4], ['USER', 5]]);
    expect(t.instructions[1]).toMatchObject({ sources: ["'step-1/app/*.txt'"], dest: "'/opt/app/'", chown: "'user'", chmod: '0640' });
    expect(t.instructions[2]).toMatchObject({ command: { form: 'shell', script: 'apt-get update && apt-get install -y figlet' }, user: "'root'", force: true });
    expect(t.files).toEqual([{ step: 1, hash: HASH, dir: 'step-1' }]);
    expect(t.config).toEqual({ startCmd: 'sleep infinity', readyCmd: 'true' });
    expect(t.noCache).toBe(true);
  });

  it("builds E2B's base image (fromBaseImage) FROM Capsule's template base", () => {
    expect(translateTemplate({ fromImage: 'e2bdev/base' }).from).toBe('base');
    expect(translateTemplate({ fromImage: 'e2bdev/base:latest' }).from).toBe('base');
    expect(translateTemplate({ fromImage: '127.0.0.1:5000/team/app:v1' }).from).toBe('127.0.0.1:5000/team/app:v1');
  });

  it('refuses by name what a build cannot honour', () => {
    expect(() => translateTemplate({ fromImage: 'x:1', fromImageRegistry: { type: 'registry', username: 'u', password: 'p' } })).toThrow(/registry credentials are the operator's/);
    expect(() => translateTemplate({ fromImage: 'x:1', fromTemplate: 'y' })).toThrow(/exactly one of fromImage and fromTemplate/);
    expect(() => translateTemplate({})).toThrow(/exactly one of fromImage and fromTemplate/);
    for (const [command, helper] of [['pip install requests', /pipInstall .*PyPI/], ['npm install -g typescript', /npmInstall .*npm registry/], ['bun install', /bunInstall/], ['git clone https://x/y', /gitClone/]] as const) {
      expect(() => translateTemplate({ fromTemplate: 'b', steps: [{ type: 'RUN', args: [command, 'root'] }] })).toThrow(helper);
    }
    expect(() => translateTemplate({ fromTemplate: 'b', steps: [{ type: 'HEALTHCHECK', args: ['x'] }] })).toThrow(/step 1: the step type "HEALTHCHECK" is not supported/);
    expect(() => translateTemplate({ fromTemplate: 'b', steps: [{ type: 'COPY', args: ['a', '/b'] }] })).toThrow(/needs the hash of its files/);
    expect(() => translateTemplate({ fromTemplate: 'b', steps: [{ type: 'ENV', args: ['1A', 'x'] }] })).toThrow(/not a valid environment variable name/);
  });

  it('plans steps as the base user until a USER, a RUN as its own user without changing later ones, a forced step anew', async () => {
    const context = await tempDir();
    const base: BuildBase = { layer: 'l'.repeat(64), config: { env: { PATH: '/bin' }, workdir: '/home/user', user: 'user' }, parent: { kind: 'template', id: 'x', name: 'b' } };
    const plan = (steps: Parameters<typeof translateTemplate>[0]['steps']) =>
      planBuild(translateTemplate({ fromTemplate: 'b', steps }).instructions, { owner: 'alice', context: new BuildContext(context), buildArgs: {}, network: { mode: 'none' }, resolveBase: () => Promise.resolve(base), file: 'step', stepUser: 'base' });
    const steps = [{ type: 'RUN', args: ['whoami'] }, { type: 'RUN', args: ['whoami', 'root'] }, { type: 'RUN', args: ['whoami'] }, { type: 'USER', args: ['guest'] }, { type: 'RUN', args: ['whoami'] }];
    const planned = await plan(steps);
    expect(planned.steps.filter((s) => s.run).map((s) => s.run!.user)).toEqual(['user', 'root', 'user', 'guest']);
    expect(planned.config.user).toBe('guest');
    // The same steps plan the same keys; a forced step changes its key and every later one.
    const again = await plan(steps);
    expect(again.steps.map((s) => s.key)).toEqual(planned.steps.map((s) => s.key));
    const forced = await plan(steps.map((s, i) => (i === 2 ? { ...s, force: true } : s)));
    expect(forced.steps.map((s, i) => s.key === planned.steps[i]!.key)).toEqual([true, true, false, false, false]);
    // Without a USER the template keeps its base's user.
    expect((await plan([{ type: 'RUN', args: ['whoami', 'root'] }])).config.user).toBe('user');
  });
});

describe("a COPY step's tar as a build context", () => {
  it('unpacks files, directories and links of a gzipped or plain tar, modes kept to 0777', async () => {
    const archive = await tarOf([
      { name: 'app', type: 'dir', mode: 0o755, size: 0 },
      file('app/run.sh', '#!/bin/sh\n', 0o4755),
      file(`app/${'long-name-'.repeat(15)}.txt`, 'long\n'),
      { name: 'app/link', type: 'symlink', mode: 0o777, size: 0, linkname: '/etc/passwd' },
    ]);
    for (const bytes of [archive, gzipSync(archive)]) {
      const root = await tempDir();
      expect(await unpackContextTar(Readable.from([bytes]), root)).toEqual({ entries: 4, bytes: 15 });
      expect((await stat(join(root, 'app/run.sh'))).mode & 0o7777).toBe(0o755);
      expect(await readFile(join(root, `app/${'long-name-'.repeat(15)}.txt`), 'utf8')).toBe('long\n');
      expect(await readlink(join(root, 'app/link'))).toBe('/etc/passwd');
    }
  });

  it('refuses paths out of the context, writes through a link, twice-named files, hard links and devices', async () => {
    const refused = async (entries: TarEntry[] | Buffer, why: RegExp) => {
      const bytes = Buffer.isBuffer(entries) ? entries : await tarOf(entries);
      const error = await unpackContextTar(Readable.from([bytes]), await tempDir()).then(() => undefined, (e: unknown) => e as { code?: string; message?: string });
      expect(error?.code).toBe('INVALID_ARGUMENT');
      expect(error?.message).toMatch(why);
    };
    await refused([file('../escape', 'x')], /leaves the archive's directory/);
    await refused([file('/etc/evil', 'x')], /absolute path/);
    await refused([{ name: 'out', type: 'symlink', mode: 0o777, size: 0, linkname: '/etc' }, file('out/evil', 'x')], /under the symbolic link "out"/);
    await refused([file('a', 'x'), file('a', 'y')], /twice/);
    const typed = (flag: string) => {
      const header = entryHeader({ name: 'dev', type: 'symlink', mode: 0o644, size: 0, linkname: 'a' });
      header.write(flag, 156, 'ascii');
      header.write('        ', 148, 'ascii');
      let sum = 0;
      for (const byte of header) sum += byte;
      header.write(`${sum.toString(8).padStart(6, '0')}\0 `, 148, 'ascii');
      return Buffer.concat([header, Buffer.alloc(1024)]);
    };
    await refused(typed('1'), /hard link/);
    await refused(typed('3'), /device, fifo or other special file/);
    await refused(Buffer.from('not a tar at all'.padEnd(512, '!')), /checksum/);
  });

  it('stops past its bounds with PAYLOAD_TOO_LARGE', async () => {
    const bytes = await tarOf([file('a', 'x'.repeat(100)), file('b', 'y')]);
    await expect(unpackContextTar(Readable.from([bytes]), await tempDir(), { maxBytes: 50 })).rejects.toMatchObject({ code: 'PAYLOAD_TOO_LARGE' });
    await expect(unpackContextTar(Readable.from([bytes]), await tempDir(), { maxEntries: 1 })).rejects.toMatchObject({ code: 'PAYLOAD_TOO_LARGE' });
  });
});

describe('template file uploads', () => {
  it('signs a URL for one tenant and hash, until it expires', async () => {
    const files = new TemplateFiles(await tempDir());
    const grant = { tenantId: 'alice', hash: HASH };
    const signed = files.sign(grant, 1_000_000);
    expect(files.verify({ ...grant, ...signed }, 1_000_000)).toEqual(grant);
    expect(() => files.verify({ ...grant, tenantId: 'bob', ...signed }, 1_000_000)).toThrow(/not signed by this server/);
    expect(() => files.verify({ ...grant, hash: 'b'.repeat(64), ...signed }, 1_000_000)).toThrow(/not signed by this server/);
    expect(() => files.verify({ ...grant, ...signed, expires: String(Number(signed.expires) + 1) }, 1_000_000)).toThrow(/not signed by this server/);
    expect(() => files.verify({ ...grant, ...signed }, 1_000_000 + files.limits.urlTtlMs + 1000)).toThrow(/expired/);
    expect(() => new TemplateFiles('/nonexistent').verify({ ...grant, ...signed }, 1_000_000)).toThrow(/not signed by this server/);
  });

  it('stores an upload whole or not at all, bounded, keeping the recently used within the tenant bounds', async () => {
    const dir = await tempDir();
    let clock = 1_000_000_000_000;
    const files = new TemplateFiles(dir, { limits: { maxUploadBytes: 10, maxTenantFiles: 2 }, now: () => (clock += 1000) });
    const hash = (c: string) => c.repeat(64);
    await expect(files.save({ tenantId: 'alice', hash: hash('a') }, Readable.from([Buffer.alloc(11)]))).rejects.toMatchObject({ code: 'PAYLOAD_TOO_LARGE' });
    expect(await files.has('alice', hash('a'))).toBe(false);
    await files.save({ tenantId: 'alice', hash: hash('a') }, Readable.from([Buffer.from('one')]));
    await files.save({ tenantId: 'alice', hash: hash('b') }, Readable.from([Buffer.from('two')]));
    expect(await files.has('bob', hash('a'))).toBe(false);
    // a is used again, so b is the least recently used when c comes.
    expect(await files.has('alice', hash('a'))).toBe(true);
    await files.save({ tenantId: 'alice', hash: hash('c') }, Readable.from([Buffer.from('three')]));
    expect([await files.has('alice', hash('a')), await files.has('alice', hash('b')), await files.has('alice', hash('c'))]).toEqual([true, false, true]);
  });
});

describe('E2B template builds in memory', () => {
  const entry = (step: string, message: string): LogEntry => ({ timestamp: new Date(0).toISOString(), level: 'info', step, message });
  const request = (builds: E2bTemplateBuilds, tenant: string, name = 'app') => builds.request(tenant, { templateID: name, ref: `${name}:latest`, tags: ['latest'], limits: {} });
  const settled = async (build: E2bBuild) => {
    for (let i = 0; i < 100 && (build.status === 'building' || build.status === 'waiting'); i++) await Promise.resolve();
  };

  it("keeps a tenant's builds from another, a failure's reason with its step's last lines, and bounds what it keeps", async () => {
    let clock = 0;
    const builds = new E2bTemplateBuilds(() => clock);
    const mine = request(builds, 'alice');
    expect(() => builds.get('bob', 'app', mine.buildID)).toThrow(/no template build/);
    expect(builds.hasOpen('alice', 'app')).toBe(true);
    expect(builds.hasOpen('bob', 'app')).toBe(false);
    builds.start(mine, (onLog) => {
      onLog(entry('base', 'FROM x'));
      for (let i = 0; i < 30; i++) onLog(entry('2', `line ${i}`));
      return Promise.reject(new SandboxError('BUILD_FAILED', 'step:2: RUN failed with exit code 3: line 29', { details: { step: '2' }, hint: 'not shown' }));
    });
    expect(() => builds.start(mine, () => Promise.reject(new Error('twice')))).toThrow(/already started/);
    await settled(mine);
    expect(mine.status).toBe('error');
    expect(mine.reason?.message).toBe('step:2: RUN failed with exit code 3: line 29');
    expect(mine.reason?.step).toBe('2');
    expect(mine.reason?.logEntries.map((e) => e.message).slice(-2)).toEqual(['line 29', 'step:2: RUN failed with exit code 3: line 29']);
    expect(mine.reason?.logEntries).toHaveLength(20);
    expect(mine.log).toHaveLength(32);

    // At most 8 open builds a tenant (the failed one is not open); the finished ones past 10 go, the oldest first.
    for (let i = 0; i < 8; i++) request(builds, 'alice', `open-${i}`);
    expect(() => request(builds, 'alice', 'one-more')).toThrow(/at most 8 template builds/);
    request(builds, 'bob');
    const finished: E2bBuild[] = [];
    const carol = new E2bTemplateBuilds(() => (clock += 1000));
    for (let i = 0; i < 12; i++) {
      const build = request(carol, 'carol', `f-${i}`);
      carol.start(build, () => Promise.reject(new Error('boom')));
      await settled(build);
      finished.push(build);
    }
    request(carol, 'carol', 'next');
    expect(finished.map((b) => { try { return carol.get('carol', b.templateID, b.buildID) && true; } catch { return false; } })).toEqual([false, false, ...Array<boolean>(10).fill(true)]);
    expect(finished[2]!.reason?.message).toMatch(/^the build failed: boom/);
  });
});
