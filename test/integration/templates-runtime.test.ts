import { readFile, readdir, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { SandboxManager } from '../../src/engine/sandbox-manager.js';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { RANGE_BASE, RANGE_SIZE } from '../../src/host/uid-ranges.js';
import { BACKENDS } from '../../src/sandbox-spec/index.js';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';
import { layerMarker, miniCatalog, miniTemplateLayer } from '../helpers/mini-template.js';

/**
 * Sandboxes from a template, on the real kernel and on gVisor: a private copy-on-write root,
 * root inside a user namespace of the sandbox's own with a range of host ids, the template's
 * user by default, the template itself never written. The layer is a small one made from host
 * programs (test/helpers/mini-template.ts); Debian templates are tested end to end elsewhere.
 */
const T = 'tenant-a';
let engine: SandboxManager;
let layer: string;
const host = () => new HostEnvironment({ dataDir: testDataDir() });

beforeAll(async () => {
  layer = await miniTemplateLayer(host().volume);
  engine = await SandboxManager.open({ dataDir: testDataDir(), templates: miniCatalog(layer) });
});

afterAll(async () => {
  await engine.close();
});

afterEach(expectNoLeaks);

async function sh(sandboxId: string, script: string, user?: string): Promise<{ outcome: string; stdout: string; stderr: string; exitCode: number | null }> {
  const process = await engine.startProcess(T, sandboxId, { argv: ['/bin/sh', '-c', script], ...(user ? { user } : {}) });
  return process.result;
}

/** The host uid a process of the sandbox runs as, from /proc (its first pid with that name). */
async function hostUidOf(pattern: RegExp): Promise<number | undefined> {
  for (const pid of await readdir('/proc')) {
    if (!/^\d+$/.test(pid)) continue;
    const cmdline = await readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => '');
    if (!pattern.test(cmdline.replace(/\0/g, ' '))) continue;
    const status = await readFile(`/proc/${pid}/status`, 'utf8').catch(() => '');
    const uid = /^Uid:\s+(\d+)/m.exec(status)?.[1];
    if (uid !== undefined) return Number(uid);
  }
  return undefined;
}

describe.each(BACKENDS)('sandboxes from a template on the %s backend', (backend) => {
  it('run as the template user by default, as root when asked, with the template env and workdir', async () => {
    const info = await engine.create({ tenantId: T, spec: { template: 'mini', backend } });
    try {
      expect(info.spec).toMatchObject({ template: 'mini:latest', user: 'user', cwd: '/home/user', env: { FROM_TEMPLATE: 'yes' } });
      const me = await sh(info.sandboxId, 'id -u; id -un; id -G; echo $HOME $USER $FROM_TEMPLATE; pwd');
      expect(me.stdout).toBe('1000\nuser\n1000 50\n/home/user user yes\n/home/user\n');
      const root = await sh(info.sandboxId, 'id -u; echo $HOME; touch /root/made && chown 1000:50 /root/made && stat -c %u:%g /root/made', 'root');
      expect(root).toMatchObject({ outcome: 'ok', stdout: '0\n/root\n1000:50\n' });
      // /tmp and /dev/shm are sticky and world-writable, as on any Debian system (apt's _apt needs it).
      expect((await sh(info.sandboxId, 'touch /tmp/mine /dev/shm/mine && stat -c %a /tmp /dev/shm')).stdout).toBe('1777\n1777\n');
      // The template user is not root: /root stays closed to it.
      expect((await sh(info.sandboxId, 'touch /root/nope')).outcome).toBe('exit_nonzero');
    } finally {
      await engine.kill(T, info.sandboxId);
    }
  });

  it('writes to a private copy-on-write root: the template and other sandboxes never see it', async () => {
    const [a, b] = await Promise.all([0, 1].map(() => engine.create({ tenantId: T, spec: { template: 'mini', backend } })));
    try {
      expect((await sh(a!.sandboxId, 'echo changed > /etc/template-marker && rm /usr/bin/true && echo a > /workspace/f', 'root')).outcome).toBe('ok');
      expect((await sh(b!.sandboxId, 'cat /etc/template-marker; ls /usr/bin/true; ls /workspace')).stdout).toBe('mini\n/usr/bin/true\n');
      expect(await layerMarker(layer)).toBe('mini\n');
      // On the host the change sits in a's own root subvolume, under raw ids (not a host range).
      const root = host().volume.rootPath(a!.sandboxId);
      expect(await readFile(join(root, 'etc/template-marker'), 'utf8')).toBe('changed\n');
      expect((await stat(join(root, 'workspace/f'))).uid).toBe(0);
    } finally {
      await Promise.all([a, b].map((s) => engine.kill(T, s!.sandboxId)));
    }
  });

  it('maps its ids to a host range of its own, apart from every other live sandbox', async () => {
    const [a, b] = await Promise.all([0, 1].map(() => engine.create({ tenantId: T, spec: { template: 'mini', backend } })));
    try {
      const maps = await Promise.all([a!, b!].map(async (s) => (await sh(s.sandboxId, 'cat /proc/self/uid_map')).stdout.trim().split(/\s+/).map(Number)));
      if (backend === 'namespace') {
        for (const [inside, outside, size] of maps as [number, number, number][]) {
          expect(inside).toBe(0);
          expect(size).toBe(RANGE_SIZE);
          expect(outside).toBeGreaterThanOrEqual(RANGE_BASE);
          expect((outside - RANGE_BASE) % RANGE_SIZE).toBe(0);
        }
        expect(maps[0]![1]).not.toBe(maps[1]![1]);
      }
      if (backend === 'namespace') {
        // From the host, a sandbox's process runs as a uid of its range, never as a host account.
        // (Under gVisor the process lives inside the Sentry; there is no host process to look at.)
        const marker = `3000.${Math.floor(Math.random() * 1e9)}`;
        const sleeper = await engine.startProcess(T, a!.sandboxId, { argv: ['sleep', marker] });
        let seen: number | undefined;
        for (let tries = 0; tries < 300 && seen === undefined; tries++) {
          seen = await hostUidOf(new RegExp(`sleep ${marker.replace('.', '\\.')}`));
          if (seen === undefined) await new Promise((resolve) => setTimeout(resolve, 100));
        }
        expect(seen).toBeDefined();
        expect(seen! - RANGE_BASE).toBeGreaterThanOrEqual(1000);
        expect((seen! - RANGE_BASE) % RANGE_SIZE).toBe(1000);
        sleeper.signal('SIGKILL');
        await sleeper.result;
      }
    } finally {
      await Promise.all([a, b].map((s) => engine.kill(T, s!.sandboxId)));
    }
  });

  it('counts root and /workspace against one disk limit', async () => {
    const info = await engine.create({ tenantId: T, spec: { template: 'mini', backend, limits: { diskBytes: 8 * 2 ** 20 } } });
    try {
      const filled = await sh(info.sandboxId, 'dd if=/dev/zero of=/root/a bs=1M count=5 2>&1 && dd if=/dev/zero of=/workspace/b bs=1M count=5 2>&1', 'root');
      expect(filled.outcome).not.toBe('ok');
      expect(filled.stdout + filled.stderr).toMatch(/quota|No space/i);
    } finally {
      await engine.kill(T, info.sandboxId);
    }
  });
});

describe('the host template and root', () => {
  it('refuses another user with BACKEND_CANNOT_ENFORCE naming the field', async () => {
    const info = await engine.create({ tenantId: T });
    try {
      await expect(engine.startProcess(T, info.sandboxId, { argv: ['id'], user: 'root' })).rejects.toMatchObject({
        code: 'BACKEND_CANNOT_ENFORCE',
        details: { field: 'user', user: 'root' },
      });
    } finally {
      await engine.kill(T, info.sandboxId);
    }
  });

  it('refuses nested user namespaces inside a template sandbox (seccomp unchanged)', async () => {
    const info = await engine.create({ tenantId: T, spec: { template: 'mini' } });
    try {
      const nested = await sh(info.sandboxId, 'unshare -U true', 'root');
      expect(nested).toMatchObject({ outcome: 'exit_nonzero' });
      expect(nested.stderr).toMatch(/Operation not permitted/);
    } finally {
      await engine.kill(T, info.sandboxId);
    }
  });
});
