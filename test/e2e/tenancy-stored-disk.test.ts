import { mkdtempSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';
import { sharedDebianTemplate, TEST_DEBIAN, testTemplates } from '../helpers/templates.js';
import { expectError, readNdjson, startTestServer, type TestServer } from './server-helpers.js';

/**
 * Issue 13: snapshots (what their sandbox wrote beyond its origin) and volumes (their size) count
 * against the tenant's disk quota, across a server restart; one tenant at its quota leaves the
 * other making volumes and snapshots. Two real tenants, real sandboxes, real btrfs.
 */
const MiB = 1024 * 1024;
const QUOTA = 256 * MiB;
const databaseDir = mkdtempSync(join(testDataDir(), 'stored-disk-db-'));
let t: TestServer | undefined;
const keys: string[] = [];

afterAll(async () => {
  // Whatever a failure left: the snapshots and volumes outlive the sandboxes.
  for (const key of keys) {
    // Sandboxes first: a snapshot that a live sandbox came from is not deleted.
    const sandboxes = await t?.json<{ sandboxes: { sandboxId: string }[] }>('GET', '/v1/sandboxes', { key });
    for (const s of sandboxes?.body.sandboxes ?? []) await t?.call('DELETE', `/v1/sandboxes/${s.sandboxId}`, { key });
    const snapshots = await t?.json<{ snapshots: { snapshotId: string }[] }>('GET', '/v1/snapshots', { key });
    for (const s of snapshots?.body.snapshots ?? []) await t?.call('DELETE', `/v1/snapshots/${s.snapshotId}`, { key });
    const volumes = await t?.json<{ volumes: { name: string }[] }>('GET', '/v1/volumes', { key });
    for (const v of volumes?.body.volumes ?? []) await t?.call('DELETE', `/v1/volumes/${v.name}`, { key });
  }
  await t?.server.close();
  await expectNoLeaks();
});

interface QuotaDetails {
  for: string;
  limit: number;
  used: number;
  requested: number;
  usage: Record<string, number>;
}

describe('snapshots and volumes against the tenant disk quota (issue 13)', () => {
  it('charges a snapshot what its sandbox wrote and a volume its size, refuses past the quota naming what to delete, and keeps counting after a restart', async () => {
    t = await startTestServer({ databaseDir, tenantDiskQuotaBytes: QUOTA, warmPool: 0 });
    const mint = async (tenantId: string): Promise<string> => {
      const minted = await t!.json<{ apiKey: string }>('POST', '/v1/keys', { body: { tenantId } });
      expect(minted.status).toBe(201);
      return minted.body.apiKey;
    };
    const [a, b] = [await mint('stored-a'), await mint('stored-b')];
    keys.push(a, b);
    const volume = (key: string, name: string, sizeBytes: number) => t!.json<{ volumeId: string; details?: QuotaDetails; hint?: string }>('POST', '/v1/volumes', { key, body: { name, sizeBytes } });
    const snapshot = (key: string, sandboxId: string) => t!.json<{ snapshotId: string; chargedBytes: number; details?: QuotaDetails; hint?: string }>('POST', `/v1/sandboxes/${sandboxId}/snapshots`, { key, body: {} });
    const sandboxWith = async (key: string, writeMiB: number): Promise<string> => {
      const created = await t!.json<{ sandboxId: string }>('POST', '/v1/sandboxes', { key, body: { spec: { ttlMs: 300_000, limits: { diskBytes: 64 * MiB } } } });
      expect(created.status).toBe(201);
      const response = await t!.call('POST', `/v1/sandboxes/${created.body.sandboxId}/processes`, { key, body: { argv: ['sh', '-c', `head -c ${writeMiB}M /dev/urandom > /workspace/data.bin && sync`] } });
      expect(response.status).toBe(200);
      expect(((await readNdjson(response)).at(-1) as { result: { exitCode: number } }).result.exitCode).toBe(0);
      return created.body.sandboxId;
    };
    const snapshotsOf = async (key: string) => (await t!.json<{ snapshots: { snapshotId: string }[] }>('GET', '/v1/snapshots', { key })).body.snapshots.map((s) => s.snapshotId);

    // Tenant A: a volume (96 MiB), a sandbox (64 MiB) holding 56 MiB, a snapshot of it: 216 MiB.
    expect((await volume(a, 'a-one', 96 * MiB)).status).toBe(201);
    const sandboxA = await sandboxWith(a, 56);
    const first = await snapshot(a, sandboxA);
    expect(first.status).toBe(201);
    expect(first.body.chargedBytes).toBeGreaterThanOrEqual(56 * MiB);
    expect(first.body.chargedBytes).toBeLessThan(60 * MiB);

    // Past the quota: a second volume and a second snapshot are refused, naming what to delete.
    const refusedVolume = await volume(a, 'a-two', 64 * MiB);
    expect(refusedVolume.status).toBe(429);
    expectError(refusedVolume.body, 'QUOTA_EXCEEDED');
    expect(refusedVolume.body.details).toMatchObject({ for: 'volumes', limit: QUOTA, requested: 64 * MiB, usage: { volumes: 96 * MiB, workspaces: 64 * MiB, snapshots: first.body.chargedBytes } });
    expect(refusedVolume.body.hint).toMatch(/delete volumes .*delete snapshots/);
    const refusedSnapshot = await snapshot(a, sandboxA);
    expect(refusedSnapshot.status).toBe(429);
    expect(refusedSnapshot.body.details).toMatchObject({ for: 'snapshots' });
    expect(await snapshotsOf(a)).toEqual([first.body.snapshotId]);
    expect((await t.json('GET', '/v1/volumes/a-two', { key: a })).status).toBe(404);

    // Tenant B is not touched by A's use: a large volume, a sandbox, a snapshot.
    expect((await volume(b, 'b-one', 160 * MiB)).status).toBe(201);
    const sandboxB = await sandboxWith(b, 8);
    const ofB = await snapshot(b, sandboxB);
    expect(ofB.status).toBe(201);

    // Deleting a snapshot gives its bytes back, once, though two deletes of it race.
    const twice = await Promise.all([0, 1].map(() => t!.call('DELETE', `/v1/snapshots/${first.body.snapshotId}`, { key: a })));
    expect(twice.map((r) => r.status)).toContainEqual(204); // the other: 204 (joined it) or 404 (after it)
    for (const r of twice) expect([204, 404]).toContain(r.status);
    const second = await snapshot(a, sandboxA);
    expect(second.status).toBe(201);
    expect((await volume(a, 'a-two', 64 * MiB)).body.details).toMatchObject({ usage: { volumes: 96 * MiB, snapshots: second.body.chargedBytes } });

    // After a restart the snapshots and volumes still count (the sandboxes ended with the server).
    await t.server.close();
    t = await startTestServer({ databaseDir, tenantDiskQuotaBytes: QUOTA, warmPool: 0 });
    const afterRestart = await volume(a, 'a-two', 150 * MiB);
    expect(afterRestart.status).toBe(429);
    expect(afterRestart.body.details).toMatchObject({ for: 'volumes', usage: { volumes: 96 * MiB, snapshots: second.body.chargedBytes, workspaces: 0 } });
    expect((await volume(b, 'b-two', 100 * MiB)).body.details).toMatchObject({ usage: { volumes: 160 * MiB, snapshots: ofB.body.chargedBytes } });

    // Everything deleted, the quota is back (but for the ended sandboxes' logs, kept an hour).
    for (const [key, id] of [[a, second.body.snapshotId], [b, ofB.body.snapshotId]] as const) expect((await t.call('DELETE', `/v1/snapshots/${id}`, { key })).status).toBe(204);
    for (const [key, name] of [[a, 'a-one'], [b, 'b-one']] as const) {
      const racing = await Promise.all([0, 1].map(() => t!.call('DELETE', `/v1/volumes/${name}`, { key })));
      expect(racing.map((r) => r.status)).toContainEqual(204);
      for (const r of racing) expect([204, 404]).toContain(r.status);
    }
    const whole = await volume(a, 'a-whole', QUOTA - 16 * MiB);
    expect(whole.status).toBe(201);
    // Each volume came back once: the whole quota is the one volume now.
    expect((await volume(a, 'a-more', 32 * MiB)).body.details).toMatchObject({ for: 'volumes', usage: { volumes: QUOTA - 16 * MiB } });
    expect((await t.call('DELETE', '/v1/volumes/a-whole', { key: a })).status).toBe(204);
  });

  it('charges what a sandbox wrote though the data is not yet committed to disk (no sync before the snapshot)', async () => {
    await sharedDebianTemplate(testTemplates());
    t ??= await startTestServer({ databaseDir, tenantDiskQuotaBytes: QUOTA, warmPool: 0 });
    const minted = await t.json<{ apiKey: string }>('POST', '/v1/keys', { body: { tenantId: 'stored-dirty' } });
    const key = minted.body.apiKey;
    keys.push(key);
    for (const template of ['host', TEST_DEBIAN]) {
      const created = await t.json<{ sandboxId: string }>('POST', '/v1/sandboxes', { key, body: { spec: { template, ttlMs: 120_000, limits: { diskBytes: 64 * MiB } } } });
      expect(created.status, JSON.stringify(created.body)).toBe(201);
      const sandboxId = created.body.sandboxId;
      // Written and at once snapshotted: the btrfs transaction holding it is not committed yet.
      const wrote = await t.call('POST', `/v1/sandboxes/${sandboxId}/processes`, { key, body: { argv: ['sh', '-c', 'head -c 24M /dev/urandom > /workspace/dirty.bin'] } });
      expect(((await readNdjson(wrote)).at(-1) as { result: { exitCode: number } }).result.exitCode).toBe(0);
      const taken = await t.json<{ snapshotId: string; chargedBytes: number }>('POST', `/v1/sandboxes/${sandboxId}/snapshots`, { key, body: {} });
      expect(taken.status).toBe(201);
      expect(taken.body.chargedBytes, template).toBeGreaterThanOrEqual(24 * MiB);
      expect((await t.call('DELETE', `/v1/sandboxes/${sandboxId}`, { key })).status).toBe(200);
      expect((await t.call('DELETE', `/v1/snapshots/${taken.body.snapshotId}`, { key })).status).toBe(204);
    }
  }, 25 * 60_000);

  it("charges a snapshot of a sandbox made from a snapshot its origin's data too: the chain's middle deleted, nothing is kept uncharged", async () => {
    await sharedDebianTemplate(testTemplates());
    t ??= await startTestServer({ databaseDir, tenantDiskQuotaBytes: QUOTA, warmPool: 0 });
    const minted = await t.json<{ apiKey: string }>('POST', '/v1/keys', { body: { tenantId: 'stored-chain' } });
    const key = minted.body.apiKey;
    keys.push(key);
    const create = async (spec: Record<string, unknown>): Promise<string> => {
      const created = await t!.json<{ sandboxId: string }>('POST', '/v1/sandboxes', { key, body: { spec: { ttlMs: 120_000, limits: { diskBytes: 64 * MiB }, ...spec } } });
      expect(created.status, JSON.stringify(created.body)).toBe(201);
      return created.body.sandboxId;
    };
    const snapshot = async (sandboxId: string) => {
      const taken = await t!.json<{ snapshotId: string; chargedBytes: number }>('POST', `/v1/sandboxes/${sandboxId}/snapshots`, { key, body: {} });
      expect(taken.status, JSON.stringify(taken.body)).toBe(201);
      return taken.body;
    };
    for (const template of ['host', TEST_DEBIAN]) {
      const first = await create({ template });
      const wrote = await t.call('POST', `/v1/sandboxes/${first}/processes`, { key, body: { argv: ['sh', '-c', 'head -c 24M /dev/urandom > /workspace/data.bin && sync'] } });
      expect(((await readNdjson(wrote)).at(-1) as { result: { exitCode: number } }).result.exitCode).toBe(0);
      const origin = await snapshot(first);
      expect(origin.chargedBytes, template).toBeGreaterThanOrEqual(24 * MiB);
      expect((await t.call('DELETE', `/v1/sandboxes/${first}`, { key })).status).toBe(200);
      // A sandbox from the snapshot, snapshotted untouched: its own writes are ~nothing, but the
      // new snapshot keeps the 24 MiB as long as it lives, whatever happens to its origin.
      const middle = await create({ snapshot: origin.snapshotId });
      const kept = await snapshot(middle);
      expect(kept.chargedBytes, template).toBeGreaterThanOrEqual(origin.chargedBytes);
      expect((await t.call('DELETE', `/v1/sandboxes/${middle}`, { key })).status).toBe(200);
      expect((await t.call('DELETE', `/v1/snapshots/${origin.snapshotId}`, { key })).status).toBe(204);
      // The tenant's use, as a refusal reports it: the kept snapshot's charge, still there.
      const refused = await t.json<{ details?: QuotaDetails }>('POST', '/v1/volumes', { key, body: { name: 'too-big', sizeBytes: QUOTA } });
      expect(refused.status).toBe(429);
      expect(refused.body.details?.usage.snapshots, template).toBe(kept.chargedBytes);
      // And the data is really there: a sandbox from the kept snapshot reads it whole.
      const last = await create({ snapshot: kept.snapshotId });
      const read = await t.call('POST', `/v1/sandboxes/${last}/processes`, { key, body: { argv: ['sh', '-c', 'wc -c < /workspace/data.bin'] } });
      expect(((await readNdjson(read)).at(-1) as { result: { stdout: string } }).result.stdout.trim()).toBe(String(24 * MiB));
      expect((await t.call('DELETE', `/v1/sandboxes/${last}`, { key })).status).toBe(200);
      expect((await t.call('DELETE', `/v1/snapshots/${kept.snapshotId}`, { key })).status).toBe(204);
    }
  }, 25 * 60_000);

  it("charges a /v1 fork to the key's own disk quota, not the server's default", async () => {
    t ??= await startTestServer({ databaseDir, tenantDiskQuotaBytes: QUOTA, warmPool: 0 });
    // The key's quota (1 GiB) is above the server's default (256 MiB). A fork gets the default
    // workspace (512 MiB): beside the 64 MiB source, one fits the key's quota and none the default.
    const minted = await t.json<{ apiKey: string }>('POST', '/v1/keys', { body: { tenantId: 'stored-fork', diskQuotaBytes: 1024 * MiB } });
    expect(minted.status).toBe(201);
    const key = minted.body.apiKey;
    keys.push(key);
    const source = await t.json<{ sandboxId: string }>('POST', '/v1/sandboxes', { key, body: { spec: { limits: { diskBytes: 64 * MiB } } } });
    expect(source.status).toBe(201);
    const forked = await t.json<{ snapshot: { snapshotId: string }; forks: ({ sandbox: { sandboxId: string } } | { error: { code: string } })[] }>(
      'POST', `/v1/sandboxes/${source.body.sandboxId}/fork`, { key, body: { count: 3 } },
    );
    expect(forked.status).toBe(201);
    const made = forked.body.forks.flatMap((f) => ('sandbox' in f ? [f.sandbox.sandboxId] : []));
    const refused = forked.body.forks.flatMap((f) => ('error' in f ? [f.error.code] : []));
    expect(made).toHaveLength(1);
    expect(refused).toEqual(['QUOTA_EXCEEDED', 'QUOTA_EXCEEDED']);
    for (const id of [source.body.sandboxId, ...made]) expect((await t.call('DELETE', `/v1/sandboxes/${id}`, { key })).status).toBe(200);
    expect((await t.call('DELETE', `/v1/snapshots/${forked.body.snapshot.snapshotId}`, { key })).status).toBe(204);
  });
});
