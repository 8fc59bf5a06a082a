import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { listSandboxCgroups } from '../../src/host/cgroups.host.js';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { describeLeaks, findLeaks } from '../helpers/leaks.js';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';
import { expectError, readNdjson, startTestServer, type TestServer } from './server-helpers.js';

/**
 * Issue 11, finding 5: a tenant's disk is bounded, and one tenant's use never makes another's
 * writes fail. Two real tenants on a server of their own with a small workspace volume (320 MiB:
 * 192 MiB can be promised to workspaces) and a 160 MiB disk quota per tenant.
 */
const MiB = 1024 * 1024;
const QUOTA = 160 * MiB;
const dataDir = mkdtempSync(join(testDataDir(), 'disk-'));
const host = new HostEnvironment({ dataDir });
let t: TestServer | undefined;

afterAll(async () => {
  await t?.server.close();
  const leaks = describeLeaks(await findLeaks(dataDir));
  // This server's data dir is its own Capsule instance: its volume is ours to remove.
  await host.volume.unmount().catch(() => undefined);
  rmSync(dataDir, { recursive: true, force: true });
  expect(leaks, 'host resources left behind by the server').toBe('');
  await expectNoLeaks();
});

interface Result {
  outcome: string;
  exitCode: number | null;
  stdout: string;
  stderr: string;
}

describe('a disk quota per tenant, and a volume that is never overcommitted (issue 11, finding 5)', () => {
  it('refuses tenant A past its quota by workspaces, artifacts and logs while tenant B creates, writes and runs; refuses what the volume cannot back', async () => {
    t = await startTestServer({ dataDir, volumeBytes: 320 * MiB, tenantDiskQuotaBytes: QUOTA, warmPool: 0 });
    const server = t;
    const mint = async (tenantId: string): Promise<string> => {
      const minted = await server.json<{ apiKey: string }>('POST', '/v1/keys', { body: { tenantId } });
      expect(minted.status).toBe(201);
      return minted.body.apiKey;
    };
    const [a, b] = [await mint('tenant-a'), await mint('tenant-b')];
    const create = (key: string, diskBytes: number) =>
      server.json<{ sandboxId: string; code?: string; details?: Record<string, unknown> }>('POST', '/v1/sandboxes', { key, body: { spec: { limits: { diskBytes } } } });
    const exec = async (key: string, sandboxId: string, script: string): Promise<{ status: number; result?: Result; body?: unknown }> => {
      const response = await server.call('POST', `/v1/sandboxes/${sandboxId}/processes`, { key, body: { argv: ['sh', '-c', script] } });
      if (response.status !== 200) return { status: response.status, body: await response.json() };
      const lines = await readNdjson(response);
      return { status: 200, result: (lines.at(-1) as { result: Result }).result };
    };
    const quotaError = (body: unknown, what: string): Record<string, unknown> => {
      expectError(body, 'QUOTA_EXCEEDED');
      const details = (body as { details: Record<string, unknown> }).details;
      expect(details).toMatchObject({ resource: 'disk', for: what, unit: 'bytes', limit: QUOTA });
      expect((details.used as number) + (details.requested as number)).toBeGreaterThan(QUOTA);
      expect((body as { hint?: string }).hint).toMatch(/--tenant-disk-quota/);
      return details;
    };

    // Workspaces count by their disk limits.
    const a1 = await create(a, 64 * MiB);
    expect(a1.status).toBe(201);
    const a2 = await create(a, 112 * MiB);
    expect(a2.status).toBe(429);
    expect(quotaError(a2.body, 'workspaces')).toMatchObject({ used: 64 * MiB, requested: 112 * MiB });

    // A fills its workspace to its limit: 60 MiB to collect, and as much more as the quota group lets it.
    const filled = await exec(a, a1.body.sandboxId, 'mkdir -p /workspace/output && head -c 62914560 /dev/zero > /workspace/output/big && cat /dev/zero > /workspace/fill; stat -c %s /workspace/output/big');
    expect(filled.result?.stdout.trim()).toBe(String(60 * MiB));

    // Artifacts: the first collection fits, the second would not and copies nothing.
    const collect = () => server.json<{ artifacts: { size?: number }[] }>('POST', `/v1/sandboxes/${a1.body.sandboxId}/artifacts`, { key: a, body: {} });
    const first = await collect();
    expect(first.status).toBe(200);
    expect(first.body.artifacts.map((x) => x.size)).toEqual([60 * MiB]);
    const second = await collect();
    expect(second.status).toBe(429);
    quotaError(second.body, 'artifacts');
    const stored = await server.json<{ artifacts: { sha256: string }[] }>('GET', '/v1/artifacts', { key: a });
    expect(stored.body.artifacts).toHaveLength(1);

    // Logs: output past the caps is logged only while the tenant has room; then no process starts.
    const flood = await server.call('POST', `/v1/sandboxes/${a1.body.sandboxId}/processes`, { key: a, body: { argv: ['sh', '-c', 'yes 0123456789abcdef | head -c 104857600'] } });
    const floodEvents = await readNdjson(flood);
    const floodPid = floodEvents[0]?.pid as number;
    expect((floodEvents.at(-1) as { result: { stdoutBytes: number } }).result.stdoutBytes).toBe(100 * MiB);
    const log = await server.call('GET', `/v1/sandboxes/${a1.body.sandboxId}/processes/${floodPid}/log`, { key: a });
    const logged = (await readNdjson(log)).reduce((sum, line) => sum + Buffer.from(line.data as string, 'base64').length, 0);
    expect(logged).toBeGreaterThan(MiB);
    expect(logged).toBeLessThan(QUOTA - 124 * MiB);
    const refused = await exec(a, a1.body.sandboxId, 'true');
    expect(refused.status).toBe(429);
    quotaError(refused.body, 'logs');

    // Tenant B is untouched: it creates, fills its workspace to nearly its limit beside A's full one, writes and runs.
    const b1 = await create(b, 96 * MiB);
    expect(b1.status).toBe(201);
    // (Three files: one file may hold at most limits.fileSizeBytes, 64 MiB by default.)
    const wrote = await exec(b, b1.body.sandboxId, 'for f in 1 2 3; do head -c 31457280 /dev/zero > /workspace/data$f || exit 1; done; cat /workspace/data? | wc -c');
    expect(wrote.result).toMatchObject({ outcome: 'ok' });
    expect(wrote.result?.stdout.trim()).toBe(String(90 * MiB));
    const put = await server.call('PUT', `/v1/sandboxes/${b1.body.sandboxId}/files?path=/workspace/note.txt`, { key: b, raw: 'still writable', headers: { 'content-type': 'application/octet-stream' } });
    expect(put.status).toBe(200);
    expect((await exec(b, b1.body.sandboxId, 'cat /workspace/note.txt')).result).toMatchObject({ outcome: 'ok', stdout: 'still writable' });

    // The volume: 160 MiB of its 192 MiB are promised; B's 48 MiB more fit B's quota but not the volume.
    const cgroupsBefore = (await listSandboxCgroups(host.cgroupPrefix)).length;
    const b2 = await create(b, 48 * MiB);
    expect(b2.status).toBe(503);
    expectError(b2.body, 'CAPACITY_EXHAUSTED');
    expect(b2.headers.get('retry-after')).toMatch(/^\d+$/);
    expect(b2.body.details).toMatchObject({ resource: 'workspace_volume', usedBytes: 160 * MiB, requestedBytes: 48 * MiB, limitBytes: 192 * MiB });
    // Nothing was left behind: no record, no workspace, no cgroup.
    const listed = await server.json<{ sandboxes: { sandboxId: string }[] }>('GET', '/v1/sandboxes', { key: b });
    expect(listed.body.sandboxes.map((s) => s.sandboxId)).toEqual([b1.body.sandboxId]);
    expect(readdirSync(host.volume.mountPoint).filter((name) => name.startsWith('ws-')).sort()).toEqual([`ws-${a1.body.sandboxId}`, `ws-${b1.body.sandboxId}`].sort());
    expect((await listSandboxCgroups(host.cgroupPrefix)).length).toBe(cgroupsBefore);

    // Freeing disk gives it back at once: with its artifact deleted, A runs again.
    const deleted = await server.call('DELETE', `/v1/artifacts/${stored.body.artifacts[0]?.sha256}`, { key: a });
    expect(deleted.status).toBe(204);
    expect((await exec(a, a1.body.sandboxId, 'echo again')).result).toMatchObject({ outcome: 'ok', stdout: 'again\n' });
    for (const [key, id] of [[a, a1.body.sandboxId], [b, b1.body.sandboxId]] as const) {
      expect((await server.call('DELETE', `/v1/sandboxes/${id}`, { key })).status).toBe(200);
    }
  }, 180_000);
});
