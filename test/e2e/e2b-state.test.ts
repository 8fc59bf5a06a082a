import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { Sandbox, Volume, VolumeNotFoundError } from 'e2b';
import { expectNoLeaks } from '../helpers/sandbox.js';
import { startE2bServer, type E2bTestServer } from './e2b-harness.js';
import { waitFor } from './server-helpers.js';

/**
 * The official `e2b` SDK (2.51.0, unmodified) against Capsule's facade for state: snapshots,
 * create from a snapshot, fork, pause and its lifecycle options, volumes. Two real tenants: one
 * cannot see or use the other's snapshots or volumes.
 */
let server: E2bTestServer;
/** Tenant B's SDK options: the same server, another tenant's key. */
let other: E2bTestServer['opts'];
const made: Sandbox[] = [];

beforeAll(async () => {
  server = await startE2bServer();
  const minted = await server.json<{ apiKey: string }>('POST', '/v1/keys', { body: { tenantId: 'tenant-b' } });
  expect(minted.status).toBe(201);
  other = { ...server.opts, apiKey: `e2b_${minted.body.apiKey.slice('cap_'.length)}` };
});
afterEach(async () => {
  for (const sandbox of made.splice(0)) await sandbox.kill().catch(() => undefined);
});
afterAll(async () => {
  await server?.server.close();
  await expectNoLeaks();
});

async function create(template?: string, options: Parameters<typeof Sandbox.create>[1] = {}): Promise<Sandbox> {
  const sandbox = template === undefined ? await Sandbox.create({ ...server.opts, timeoutMs: 120_000, ...options }) : await Sandbox.create(template, { ...server.opts, timeoutMs: 120_000, ...options });
  made.push(sandbox);
  return sandbox;
}

async function listSnapshots(opts: E2bTestServer['opts'], sandboxId?: string): Promise<{ snapshotId: string; names: string[] }[]> {
  const paginator = Sandbox.listSnapshots({ ...opts, ...(sandboxId !== undefined ? { sandboxId } : {}) });
  const all: { snapshotId: string; names: string[] }[] = [];
  while (paginator.hasNext) all.push(...(await paginator.nextItems()));
  return all;
}

describe('e2b SDK 2.51: snapshots, fork, lifecycle and volumes against Capsule', () => {
  it('snapshots a sandbox, creates from the snapshot, lists and deletes it; another tenant sees none of it', async () => {
    const source = await create();
    await source.files.write('state.json', '{"step": 1}');
    const snapshot = await source.createSnapshot({ name: 'step-one' });
    expect(snapshot.snapshotId).toMatch(/^snap_/);
    expect(snapshot.names).toEqual(['step-one']);
    // The source runs on, and a change after the snapshot is not in it.
    await source.files.write('state.json', '{"step": 2}');

    const restored = await create(snapshot.snapshotId);
    expect(await restored.files.read('state.json')).toBe('{"step": 1}');
    expect((await restored.commands.run('whoami')).stdout).toBe('user\n');
    expect((await restored.getInfo()).templateId).toBe(snapshot.snapshotId);

    expect((await listSnapshots(server.opts)).map((s) => s.snapshotId)).toContain(snapshot.snapshotId);
    expect(await listSnapshots(server.opts, source.sandboxId)).toEqual([{ snapshotId: snapshot.snapshotId, names: ['step-one'] }]);
    const perSandbox: { snapshotId: string }[] = [];
    const paginator = source.listSnapshots();
    while (paginator.hasNext) perSandbox.push(...(await paginator.nextItems()));
    expect(perSandbox.map((s) => s.snapshotId)).toEqual([snapshot.snapshotId]);

    // Tenant B: not listed, not usable, not deletable.
    expect((await listSnapshots(other)).map((s) => s.snapshotId)).not.toContain(snapshot.snapshotId);
    const foreign = await Sandbox.create(snapshot.snapshotId, { ...other, timeoutMs: 60_000 }).catch((error: unknown) => error);
    expect(String(foreign)).toMatch(/snapshot .* not found/);
    expect(await Sandbox.deleteSnapshot(snapshot.snapshotId, other)).toBe(false);

    // A snapshot a live sandbox came from is kept until that sandbox ends.
    const refused = await Sandbox.deleteSnapshot(snapshot.snapshotId, server.opts).catch((error: unknown) => error);
    expect(String(refused)).toMatch(/origin of 1 live sandbox/);
    await restored.kill();
    expect(await Sandbox.deleteSnapshot(snapshot.snapshotId, server.opts)).toBe(true);
    expect(await Sandbox.deleteSnapshot(snapshot.snapshotId, server.opts)).toBe(false);
    expect(await listSnapshots(server.opts, source.sandboxId)).toEqual([]);
  });

  it('forks a sandbox into independent sandboxes with its files; the source is unharmed', async () => {
    const source = await create(undefined, { metadata: { role: 'source' } });
    await source.files.write('shared.txt', 'from the source');
    const forks = await source.fork({ count: 2, timeoutMs: 90_000 });
    expect(forks).toHaveLength(2);
    const sandboxes = forks.map((fork) => {
      if (!(fork instanceof Sandbox)) throw fork;
      made.push(fork);
      return fork;
    });
    for (const [index, fork] of sandboxes.entries()) {
      expect(fork.sandboxId).not.toBe(source.sandboxId);
      expect(await fork.files.read('shared.txt')).toBe('from the source');
      await fork.files.write('shared.txt', `fork ${index}`);
      const info = await fork.getInfo();
      expect(info.metadata).toMatchObject({ forkOf: source.sandboxId, forkIndex: String(index) });
      expect(info.endAt.getTime() - Date.now()).toBeGreaterThan(60_000);
    }
    expect(await sandboxes[0]!.files.read('shared.txt')).toBe('fork 0');
    expect(await sandboxes[1]!.files.read('shared.txt')).toBe('fork 1');
    expect(await source.files.read('shared.txt')).toBe('from the source');
    // Tenant B cannot fork A's sandbox.
    const foreign = await Sandbox.fork(source.sandboxId, { ...other, count: 1 }).catch((error: unknown) => error);
    expect((foreign as Error).name).toBe('SandboxNotFoundError');
    // The forks came from one snapshot of the source, listed as such; it goes once they end.
    const [taken] = await listSnapshots(server.opts, source.sandboxId);
    for (const fork of sandboxes) await fork.kill();
    expect(await Sandbox.deleteSnapshot(taken!.snapshotId, server.opts)).toBe(true);
  });

  it("pauses keeping processes, resumes on connect; with autoResume the next command resumes it; getInfo says the lifecycle", async () => {
    const plain = await create();
    expect((await plain.getInfo()).lifecycle).toEqual({ onTimeout: 'kill', autoResume: false });
    const sleeper = await plain.commands.run('sleep 600', { background: true });
    expect(await plain.pause()).toBe(true);
    const stillPaused = await plain.commands.run('echo hi').catch((error: unknown) => error);
    expect(stillPaused).toBeInstanceOf(Error);
    expect((await plain.getInfo()).state).toBe('paused');
    await plain.connect();
    expect((await plain.getInfo()).state).toBe('running');
    expect((await plain.commands.list()).map((p) => p.pid)).toContain(sleeper.pid);

    const auto = await create(undefined, { lifecycle: { onTimeout: 'pause', autoResume: true } });
    expect((await auto.getInfo()).lifecycle).toEqual({ onTimeout: 'pause', autoResume: true });
    await auto.files.write('kept.txt', 'kept');
    expect(await auto.pause()).toBe(true);
    expect((await auto.getInfo()).state).toBe('paused');
    // Traffic resumes it: a command, then files, just work.
    expect((await auto.commands.run('cat kept.txt')).stdout).toBe('kept');
    expect((await auto.getInfo()).state).toBe('running');
  });

  it('/v1: spec.autoResume resumes a paused sandbox on its next process start; without it the call is refused', async () => {
    const start = (sandboxId: string) => server.call('POST', `/v1/sandboxes/${sandboxId}/processes`, { body: { argv: ['true'] } });
    const ids: string[] = [];
    try {
      for (const autoResume of [false, true]) {
        const created = await server.json<{ sandboxId: string }>('POST', '/v1/sandboxes', { body: { spec: { autoResume, ttlMs: 120_000 } } });
        expect(created.status).toBe(201);
        ids.push(created.body.sandboxId);
        const paused = await server.json<{ pause: Record<string, unknown> }>('POST', `/v1/sandboxes/${created.body.sandboxId}/pause`, { body: {} });
        expect(paused.body.pause).toMatchObject({ ttl: 'running', resumesOn: autoResume ? 'call' : 'resume' });
        const response = await start(created.body.sandboxId);
        await response.body?.cancel();
        expect(response.status).toBe(autoResume ? 200 : 409);
        const after = await server.json<{ state: string }>('GET', `/v1/sandboxes/${created.body.sandboxId}`);
        expect(after.body.state).toBe(autoResume ? 'running' : 'paused');
      }
    } finally {
      for (const id of ids) await server.call('DELETE', `/v1/sandboxes/${id}`);
    }
  });

  it('pauses at the timeout with onTimeout "pause" instead of ending, and a connect resumes it', async () => {
    const sandbox = await create(undefined, { timeoutMs: 3_000, lifecycle: { onTimeout: 'pause' } });
    await sandbox.files.write('note.txt', 'still here');
    await waitFor(async () => ((await sandbox.getInfo()).state === 'paused' ? true : undefined), { timeoutMs: 60_000, what: 'the sandbox to pause at its timeout' });
    const v1 = await server.json<{ pause: { ttl: string; resumesOn: string } }>('GET', `/v1/sandboxes/${sandbox.sandboxId}`);
    expect(v1.body.pause).toMatchObject({ ttl: 'suspended', resumesOn: 'resume', keepsMemory: true });
    const resumed = await Sandbox.connect(sandbox.sandboxId, { ...server.opts, timeoutMs: 60_000 });
    expect(await resumed.files.read('note.txt')).toBe('still here');
    expect((await resumed.getInfo()).state).toBe('running');
  });

  it('refuses by name what Capsule cannot honour: onTimeout keepMemory false, onResume reboot of a memory pause', async () => {
    const keepMemory = await Sandbox.create({ ...server.opts, lifecycle: { onTimeout: { action: 'pause', keepMemory: false } } }).catch((error: unknown) => error);
    expect(String(keepMemory)).toMatch(/keepMemory: false is not supported by Capsule's E2B facade/);
    const sandbox = await create();
    await sandbox.pause();
    const reboot = await Sandbox.connect(sandbox.sandboxId, { ...server.opts, onResume: 'reboot' }).catch((error: unknown) => error);
    expect(String(reboot)).toMatch(/onResume: "reboot" is not supported/);
  });

  it("refuses a page token it never sent and a volume name Capsule could not mount, instead of looping or making it", async () => {
    const call = (method: string, path: string, body?: unknown) =>
      fetch(`${server.opts.apiUrl}${path}`, { method, headers: { 'X-API-KEY': server.opts.apiKey, 'content-type': 'application/json' }, ...(body ? { body: JSON.stringify(body) } : {}) });
    const paged = await call('GET', `/snapshots?nextToken=${Buffer.from('snap_gone').toString('base64url')}`);
    expect(paged.status).toBe(400);
    expect(((await paged.json()) as { message: string }).message).toMatch(/nextToken/);
    const badName = await call('POST', '/volumes', { name: 'Not A/Volume' });
    expect(badName.status).toBe(400);
    const listed = await call('GET', '/volumes');
    expect(((await listed.json()) as { name: string }[]).map((v) => v.name)).not.toContain('Not A/Volume');
  });

  it('creates, lists, gets and destroys volumes, mounts them at create; another tenant sees none of it', async () => {
    const volume = await Volume.create('e2b-data', server.opts);
    expect(volume.volumeId).toMatch(/^vol_/);
    expect(volume.name).toBe('e2b-data');
    expect((await Volume.list(server.opts)).map((v) => v.volumeId)).toContain(volume.volumeId);
    expect(await Volume.getInfo(volume.volumeId, server.opts)).toMatchObject({ volumeId: volume.volumeId, name: 'e2b-data' });
    const v1 = await server.json<{ sizeBytes: number }>('GET', '/v1/volumes/e2b-data');
    expect(v1.body.sizeBytes).toBe(1024 ** 3);

    const writer = await create(undefined, { volumeMounts: { '/data': volume } });
    expect((await writer.getInfo()).volumeMounts).toEqual([{ name: 'e2b-data', path: '/data' }]);
    await writer.files.write('/data/saved.txt', 'outlives its sandbox');
    await writer.kill();
    const reader = await create(undefined, { volumeMounts: { '/data': 'e2b-data' } });
    expect(await reader.files.read('/data/saved.txt')).toBe('outlives its sandbox');

    // The content API is refused by name (a volume's files are reached through a sandbox).
    const connected = await Volume.connect(volume.volumeId, server.opts);
    const content = await connected.list('/', { apiUrl: server.url }).catch((error: unknown) => error);
    expect(String(content)).toMatch(/Volume#list is not supported by Capsule's E2B facade/);

    // Tenant B: not listed, not found, not destroyable, not mountable.
    expect((await Volume.list(other)).map((v) => v.volumeId)).not.toContain(volume.volumeId);
    await expect(Volume.getInfo(volume.volumeId, other)).rejects.toBeInstanceOf(VolumeNotFoundError);
    expect(await Volume.destroy(volume.volumeId, other)).toBe(false);
    const mount = await Sandbox.create({ ...other, volumeMounts: { '/data': 'e2b-data' } }).catch((error: unknown) => error);
    expect(String(mount)).toMatch(/volume e2b-data not found/);

    // Refused while mounted, destroyed once not.
    const busy = await Volume.destroy(volume.volumeId, server.opts).catch((error: unknown) => error);
    expect(String(busy)).toMatch(/mounted by 1 live sandbox/);
    await reader.kill();
    expect(await Volume.destroy(volume.volumeId, server.opts)).toBe(true);
    expect(await Volume.destroy(volume.volumeId, server.opts)).toBe(false);
  });
});
