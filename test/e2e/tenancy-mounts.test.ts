import { execFileSync } from 'node:child_process';
import { chmod, mkdir, mkdtemp, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { SandboxInfo } from '../../src/wire/index.js';
import { DATABASE_FILE } from '../../src/store/index.js';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';
import { expectError, readNdjson, startTestServer, type TestServer } from './server-helpers.js';

/*
 * Finding 1 of issue 11: host mounts are operator grants. Two tenants on a real server: the
 * attacker holds a key granted the `datasets` root, the victim has a sandbox with a secret in its
 * workspace and in its spec's env (so in capsule.db). Every way the issue found to reach the
 * victim's data through a mount fails with a stable code before anything is made; the granted
 * tenant still reads its dataset, on both backends.
 */
let t: TestServer;
let roots: string;
let datasets: string;
let other: string;
let attacker: string;
let bystander: string;
let victim: string;
let victimSandbox: SandboxInfo;
const SECRET = 'victim-secret-7f3a9c';

beforeAll(async () => {
  roots = await mkdtemp(join(tmpdir(), 'capsule-roots-'));
  datasets = join(roots, 'datasets');
  other = join(roots, 'other');
  await mkdir(join(datasets, 'public', 'nested'), { recursive: true });
  await mkdir(other);
  await chmod(roots, 0o755);
  // World-writable on the host: only the read-only mount can refuse the sandbox's writes.
  await chmod(join(datasets, 'public'), 0o777);
  await writeFile(join(datasets, 'public', 'data.csv'), 'a,b\n1,2\n');
  await chmod(join(datasets, 'public', 'data.csv'), 0o666);
  await writeFile(join(other, 'other.txt'), 'other root\n', { mode: 0o644 });
  t = await startTestServer({ mountRoots: { datasets, other } });
  const dataDir = testDataDir();
  // What a hostile or careless host user can leave inside a granted root.
  await symlink(dataDir, join(datasets, 'link-to-data-dir'));
  await symlink(t.server.db.name, join(datasets, 'link-to-db'));
  await symlink('/proc', join(datasets, 'link-to-proc'));
  await symlink('/sys/fs/cgroup', join(datasets, 'link-to-cgroup'));
  await symlink('/', join(datasets, 'link-to-root'));
  await symlink('../../..', join(datasets, 'public', 'nested', 'up'));
  execFileSync('mkfifo', [join(datasets, 'fifo')]);
  execFileSync('mknod', [join(datasets, 'null-device'), 'c', '1', '3']);

  attacker = (await mint('attacker', ['datasets'])).apiKey;
  bystander = (await mint('bystander', [])).apiKey;
  victim = (await mint('victim', [])).apiKey;
  const created = await t.json<SandboxInfo>('POST', '/v1/sandboxes', { key: victim, body: { spec: { env: { API_TOKEN: SECRET } } } });
  expect(created.status, JSON.stringify(created.body)).toBe(201);
  victimSandbox = created.body;
  const wrote = await exec(victim, victimSandbox.sandboxId, ['sh', '-c', `echo ${SECRET} > /workspace/secret.txt`]);
  expect(wrote.exitCode).toBe(0);
});

// The victim's sandbox lives through the file: leaks are checked once the server is closed.
afterAll(async () => {
  await t?.server.close();
  if (roots) await rm(roots, { recursive: true, force: true });
  await expectNoLeaks();
});

async function mint(tenantId: string, mountRoots: string[]): Promise<{ apiKey: string; grants: unknown }> {
  const minted = await t.json<{ apiKey: string; grants: unknown }>('POST', '/v1/keys', { body: { tenantId, mountRoots } });
  expect(minted.status, JSON.stringify(minted.body)).toBe(201);
  return minted.body;
}

async function exec(key: string, sandboxId: string, argv: string[]): Promise<{ exitCode: number; stdout: string; stderr: string }> {
  const response = await t.call('POST', `/v1/sandboxes/${sandboxId}/processes`, { key, body: { argv, timeoutMs: 15_000 } });
  const exit = (await readNdjson(response)).at(-1) as { result: { exitCode: number; stdout: string; stderr: string } };
  return exit.result;
}

async function attempt(key: string, mounts: unknown[], backend: 'namespace' | 'gvisor' = 'namespace') {
  return t.json<Record<string, unknown>>('POST', '/v1/sandboxes', { key, body: { spec: { backend, mounts } } });
}

async function sandboxesOf(key: string): Promise<SandboxInfo[]> {
  return (await t.json<{ sandboxes: SandboxInfo[] }>('GET', '/v1/sandboxes', { key })).body.sandboxes;
}

describe('host mounts are operator grants', () => {
  it('takes no host path on the wire: the data dir, capsule.db, a workspace, /proc, /sys, the cgroup tree and / are unknown keys', async () => {
    const dataDir = testDataDir();
    const targets = [dataDir, join(dataDir, DATABASE_FILE), join(dataDir, 'volume', `ws-${victimSandbox.sandboxId}`), '/proc', '/sys', '/sys/fs/cgroup', '/'];
    for (const hostPath of targets) {
      const r = await attempt(attacker, [{ hostPath, sandboxPath: '/loot' }]);
      expect(r.status, hostPath).toBe(422);
      expectError(r.body, 'INVALID_SPEC');
      const r2 = await attempt(attacker, [{ root: 'datasets', hostPath, sandboxPath: '/loot' }]);
      expect(r2.status, hostPath).toBe(422);
    }
    expect(await sandboxesOf(attacker)).toEqual([]);
  });

  it('refuses a root the key was not granted, and an unknown one, with the same PERMISSION_DENIED', async () => {
    const denied = await attempt(bystander, [{ root: 'datasets', sandboxPath: '/data' }]);
    expect(denied.status).toBe(403);
    expectError(denied.body, 'PERMISSION_DENIED');
    expect(denied.body).toMatchObject({ details: { field: 'mounts[0].root' }, hint: expect.stringMatching(/granted/) as unknown });
    const unknown = await attempt(attacker, [{ root: 'secrets', sandboxPath: '/data' }]);
    expect(unknown.status).toBe(403);
    expect(unknown.body).toMatchObject({ code: 'PERMISSION_DENIED', details: { field: 'mounts[0].root' } });
    // The attacker's grant covers datasets only: the operator's other root stays out of reach.
    const otherRoot = await attempt(attacker, [{ root: 'other', sandboxPath: '/data' }]);
    expect(otherRoot.status).toBe(403);
    expect(await sandboxesOf(bystander)).toEqual([]);
  });

  it('refuses every way out of a granted root: .., absolute subpaths, symlinks to the data dir, capsule.db, /proc, the cgroup tree and /', async () => {
    const dataDirName = testDataDir().split('/').at(-1)!;
    const attacks: [string, string][] = [
      [`../../${dataDirName}`, 'INVALID_PATH'],
      ['public/../..', 'INVALID_PATH'],
      ['/etc', 'INVALID_PATH'],
      ['link-to-data-dir', 'INVALID_PATH'],
      [`link-to-data-dir/${DATABASE_FILE}`, 'INVALID_PATH'],
      [`link-to-data-dir/volume/ws-${victimSandbox.sandboxId}`, 'INVALID_PATH'],
      ['link-to-db', 'INVALID_PATH'],
      ['link-to-proc', 'INVALID_PATH'],
      ['link-to-proc/1/root', 'INVALID_PATH'],
      ['link-to-cgroup', 'INVALID_PATH'],
      ['link-to-root', 'INVALID_PATH'],
      ['public/nested/up', 'INVALID_PATH'],
      ['public/nested/up/etc', 'INVALID_PATH'],
      ['fifo', 'INVALID_PATH'],
      ['null-device', 'INVALID_PATH'],
      ['missing', 'INVALID_PATH'],
    ];
    for (const [subpath, code] of attacks) {
      const r = await attempt(attacker, [{ root: 'datasets', subpath, sandboxPath: '/loot' }]);
      expect(r.status, `${subpath}: ${JSON.stringify(r.body)}`).toBe(code === 'INVALID_PATH' ? 400 : 403);
      expectError(r.body, code);
      expect(r.body).toMatchObject({ details: { field: 'mounts[0].subpath' }, hint: expect.any(String) as unknown });
    }
    // Nothing was made for any of them, and the victim's secret never left its sandbox.
    expect(await sandboxesOf(attacker)).toEqual([]);
    const audit = await t.json<{ records: unknown[] }>('GET', '/v1/audit?limit=1000');
    expect(JSON.stringify(audit.body)).not.toContain(SECRET);
  });

  for (const backend of ['namespace', 'gvisor'] as const) {
    it(`lets the granted tenant read its dataset, read-only, on ${backend}`, async () => {
      const created = await t.json<SandboxInfo>('POST', '/v1/sandboxes', {
        key: attacker,
        body: {
          spec: {
            backend,
            mounts: [
              { root: 'datasets', subpath: 'public', sandboxPath: '/data' },
              { root: 'datasets', subpath: 'public/data.csv', sandboxPath: '/one.csv' },
            ],
          },
        },
      });
      expect(created.status, JSON.stringify(created.body)).toBe(201);
      try {
        const r = await exec(attacker, created.body.sandboxId, [
          'sh', '-c',
          'cat /data/data.csv /one.csv; touch /data/new 2>&1; sh -c "echo x >> /one.csv" 2>&1; ls /data/nested/up/ 2>&1 | head -3; true',
        ]);
        expect(r.stdout).toContain('a,b\n1,2\na,b\n1,2\n');
        expect(r.stdout).toMatch(/Read-only file system[\s\S]*Read-only file system/);
        // A symlink inside the mount resolves in the sandbox's own view, never the host's.
        expect(r.stdout).not.toContain(SECRET);
        expect(created.body.spec.mounts).toEqual([
          { root: 'datasets', subpath: 'public', sandboxPath: '/data', readOnly: true },
          { root: 'datasets', subpath: 'public/data.csv', sandboxPath: '/one.csv', readOnly: true },
        ]);
      } finally {
        await t.call('DELETE', `/v1/sandboxes/${created.body.sandboxId}`, { key: attacker });
      }
    });

    it(`refuses the FIFO, the device and a symlink out on ${backend} too`, async () => {
      for (const subpath of ['fifo', 'null-device', 'link-to-data-dir']) {
        const r = await attempt(attacker, [{ root: 'datasets', subpath, sandboxPath: '/loot' }], backend);
        expect(r.status, subpath).toBe(400);
        expectError(r.body, 'INVALID_PATH');
      }
    });
  }

  it("lets the operator's key mount every root, and refuses to grant a root the server does not have", async () => {
    const created = await t.json<SandboxInfo>('POST', '/v1/sandboxes', { body: { spec: { mounts: [{ root: 'other', sandboxPath: '/other' }] } } });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    try {
      expect((await exec(t.apiKey, created.body.sandboxId, ['cat', '/other/other.txt'])).stdout).toBe('other root\n');
    } finally {
      await t.call('DELETE', `/v1/sandboxes/${created.body.sandboxId}`);
    }
    const typo = await t.json('POST', '/v1/keys', { body: { tenantId: 'x', mountRoots: ['dataset'] } });
    expect(typo.status).toBe(400);
    expectError(typo.body, 'INVALID_ARGUMENT');
    const minted = await mint('granted', ['datasets']);
    expect(minted.grants).toEqual({ mountRoots: ['datasets'] });
    // Only the admin key mints keys: a tenant cannot grant itself a root.
    const self = await t.json('POST', '/v1/keys', { key: attacker, body: { tenantId: 'attacker', mountRoots: ['other'] } });
    expect(self.status).toBe(403);
  });

  it('never lets the operator grant the data dir, its parents, /proc, /sys, /dev or a missing directory', async () => {
    const dataDir = testDataDir();
    for (const path of [dataDir, join(dataDir, 'volume'), '/', '/tmp', '/proc', '/sys/fs/cgroup', '/dev', join(roots, 'missing')]) {
      await expect(startTestServer({ mountRoots: { bad: path } }), path).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    }
  });

  it('still has the victim untouched: its sandbox runs and its secret is where it was', async () => {
    const r = await exec(victim, victimSandbox.sandboxId, ['cat', '/workspace/secret.txt']);
    expect(r.stdout).toBe(`${SECRET}\n`);
  });
});

describe('the audit record of a create holds every loosening', () => {
  it('records raised limits, TTL, mounts by root (never a host path) on /v1', async () => {
    const created = await t.json<SandboxInfo>('POST', '/v1/sandboxes', {
      key: attacker,
      body: { spec: { ttlMs: 600_000, limits: { memoryBytes: 768 * 2 ** 20, shmBytes: 96 * 2 ** 20 }, mounts: [{ root: 'datasets', subpath: 'public', sandboxPath: '/data' }] } },
    });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    await t.call('DELETE', `/v1/sandboxes/${created.body.sandboxId}`, { key: attacker });
    const { body } = await t.json<{ records: { operation: string; phase: string; policy: string | null; tenantId: string; seq: number }[] }>('GET', '/v1/audit?limit=1000');
    const attemptRecord = body.records.filter((r) => r.operation === 'sandboxes.create' && r.phase === 'attempt' && r.tenantId === 'attacker').at(-1);
    expect(JSON.parse(attemptRecord?.policy ?? 'null')).toEqual({
      limits: { memoryBytes: 768 * 2 ** 20, shmBytes: 96 * 2 ** 20 },
      ttlMs: 600_000,
      mounts: [{ root: 'datasets', subpath: 'public', sandboxPath: '/data', readOnly: true }],
    });
    expect(JSON.stringify(body.records)).not.toContain(datasets);
  });

  it("records the E2B facade's raised limits and TTL", async () => {
    const e2bKey = `e2b_${victim.slice(4)}`;
    const response = await fetch(`${t.url}/v2/sandboxes`, {
      method: 'POST',
      headers: { 'x-api-key': e2bKey, 'content-type': 'application/json' },
      body: JSON.stringify({ templateID: 'base', timeout: 600 }),
    });
    expect(response.status).toBe(201);
    const { sandboxID } = (await response.json()) as { sandboxID: string };
    await fetch(`${t.url}/sandboxes/${sandboxID}`, { method: 'DELETE', headers: { 'x-api-key': e2bKey } });
    const { body } = await t.json<{ records: { operation: string; phase: string; policy: string | null; tenantId: string }[] }>('GET', '/v1/audit?limit=1000');
    const attemptRecord = body.records.filter((r) => r.operation === 'e2b.sandboxes.create' && r.phase === 'attempt' && r.tenantId === 'victim').at(-1);
    const policy = JSON.parse(attemptRecord?.policy ?? 'null') as { limits?: Record<string, number>; ttlMs?: number };
    expect(policy.ttlMs).toBe(600_000);
    expect(policy.limits).toMatchObject({ cpus: 2, diskBytes: 1024 * 2 ** 20, wallClockMs: 3_600_000, pids: 1024 });
  });
});
