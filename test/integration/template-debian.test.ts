import { readdir, readFile, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterEach, beforeAll, describe, expect, it } from 'vitest';
import { isSandboxError } from '../../src/errors/index.js';
import { listSandboxCgroups } from '../../src/host/cgroups.host.js';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import type { LogEntry } from '../../src/templates/build-log.js';
import { PUBLIC_OWNER } from '../../src/templates/names.js';
import type { TemplateService } from '../../src/templates/template-service.js';
import { descendants } from '../helpers/leaks.js';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';
import { sharedDebianTemplate, testTemplates, TEST_DEBIAN, type SharedDebian } from '../helpers/templates.js';

let service: TemplateService;
let shared: SharedDebian;

beforeAll(async () => {
  service = testTemplates();
  shared = await sharedDebianTemplate(service);
}, 20 * 60_000);
afterEach(expectNoLeaks);

describe('Debian bootstrap (mmdebstrap, the host\'s apt sources)', () => {
  it('makes a template with the defaults: ca-certificates, curl, ss, pgrep, and the user `user` (1000) in /home/user', async () => {
    const { template } = shared;
    expect(template).toMatchObject({ name: TEST_DEBIAN, owner: PUBLIC_OWNER, tags: ['latest'], source: 'debian', config: { user: 'user', workdir: '/home/user' } });
    // The defaults, then the packages the request named (the shared template asks for python3).
    expect(template.parent).toMatchObject({ kind: 'debian', packages: ['ca-certificates', 'curl', 'iproute2', 'procps', 'python3'] });
    expect(template.size.referencedBytes).toBeGreaterThan(100 * 1024 * 1024);
    const root = service.layers.rootOf(template.layer);
    for (const tool of ['usr/bin/curl', 'usr/bin/pgrep', 'usr/bin/apt-get', 'etc/ssl/certs/ca-certificates.crt']) expect((await stat(join(root, tool))).isFile(), tool).toBe(true);
    expect((await readdir(join(root, 'usr/bin'))).includes('ss') || (await readdir(join(root, 'usr/sbin'))).includes('ss')).toBe(true);
    expect(await readFile(join(root, 'etc/passwd'), 'utf8')).toMatch(/^user:x:1000:1000::\/home\/user:\/bin\/bash$/m);
    const home = await stat(join(root, 'home/user'));
    expect([home.uid, home.gid]).toEqual([1000, 1000]);
    // Owners on disk are the raw ids the template's sandboxes will see (0..65535).
    expect((await stat(join(root, 'usr/bin/curl'))).uid).toBe(0);
    // The template uses the host's mirrors: mmdebstrap pasted the host's source files.
    const sources = (await readdir(join(root, 'etc/apt/sources.list.d'))).join(' ');
    expect(sources).toMatch(/\.sources|\.list/);
    await expect(writeFile(join(root, 'tmp/x'), 'x')).rejects.toMatchObject({ code: 'EROFS' });
  });

  it('streamed mmdebstrap\'s progress and kept the log in the build record', async () => {
    const { template, log } = shared;
    const build = await service.getBuild(PUBLIC_OWNER, template.buildId);
    expect(build).toMatchObject({ status: 'ready', templateId: template.id, target: `${TEST_DEBIAN}:latest` });
    expect(build!.log.some((e) => e.message.startsWith('I: '))).toBe(true);
    // When this file made the template, it also saw the lines live, in order.
    if (log.length > 0) {
      expect(log.map((e) => e.message)).toEqual(expect.arrayContaining(build!.log.slice(0, 5).map((e) => e.message)));
      expect(log.every((e) => ['base', 'finalize'].includes(e.step))).toBe(true);
    }
  });

  it('cancelled mid-run, it kills mmdebstrap\'s whole cgroup and leaves no layer, process, mount or temp', async () => {
    const host = new HostEnvironment({ dataDir: testDataDir() });
    const controller = new AbortController();
    const seen: LogEntry[] = [];
    const started = Date.now();
    const pendingBefore = await service.layers.pending();
    const run = service.bootstrapDebian({
      name: 'cancelled',
      onLog: (entry) => {
        seen.push(entry);
        // apt is downloading in forked workers by now: the case a kill of the top process missed.
        if (/downloading|extracting|installing/.test(entry.message)) controller.abort();
      },
      signal: controller.signal,
    });
    const error = await run.catch((e: unknown) => e);
    expect(isSandboxError(error, 'ABORTED'), String(error)).toBe(true);
    expect(Date.now() - started).toBeLessThan(15 * 60_000);
    expect(seen.some((e) => e.message.startsWith('I: '))).toBe(true);
    expect(await service.layers.pending()).toEqual(pendingBefore);
    expect(await listSandboxCgroups(`${host.cgroupPrefix}build-`)).toEqual([]);
    expect(await descendants(process.pid)).toEqual([]);
    expect(await service.store.find(PUBLIC_OWNER, 'cancelled')).toBeUndefined();
    const mountinfo = await readFile('/proc/self/mountinfo', 'utf8');
    expect(mountinfo).not.toContain('layers-pending');
    // The build's record says what happened.
    const builds = await readdir(join(service.store.dir, PUBLIC_OWNER, 'builds'));
    const records = await Promise.all(builds.map(async (f) => JSON.parse(await readFile(join(service.store.dir, PUBLIC_OWNER, 'builds', f), 'utf8')) as { target: string; status: string; error?: { code: string } }));
    expect(records.find((r) => r.target === 'cancelled:latest')).toMatchObject({ status: 'error', error: { code: 'ABORTED' } });
    // mmdebstrap's gpg home was under the build's TMPDIR, which is gone with it.
    expect(await readdir(join(testDataDir(), 'build-tmp'))).toEqual([]);
  }, 20 * 60_000);
});
