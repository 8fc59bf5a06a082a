import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Sandbox, UnavailableError } from '../../src/sdk/index.js';
import { CapacityInfoSchema, type CapacityInfo, type SandboxInfo } from '../../src/wire/index.js';
import { expectNoLeaks } from '../helpers/sandbox.js';
import { expectError, readNdjson, startTestServer, waitFor, type TestServer } from './server-helpers.js';

/**
 * Issue 16, honest capacity: a server that admits three live sandboxes, two per tenant, with two
 * real tenants. Past its quota a tenant is refused with QUOTA_EXCEEDED, past the server's count
 * anyone with CAPACITY_EXHAUSTED (503, Retry-After), before anything is made; a create that asks
 * to wait gets the first sandbox to end, and can run a command when it returns.
 */
const SPEC = { limits: { diskBytes: 16 * 1024 * 1024 } };
let t: TestServer;
let tenantB: string;

beforeAll(async () => {
  t = await startTestServer({ maxSandboxesPerTenant: 2, admission: { maxSandboxes: 3 }, warmPool: 0 });
  const minted = await t.json<{ apiKey: string }>('POST', '/v1/keys', { body: { tenantId: 'capacity-b' } });
  tenantB = minted.body.apiKey;
});

afterAll(async () => {
  await t?.server.close();
  await expectNoLeaks();
});

const create = (key: string, body: Record<string, unknown> = {}) => t.json<SandboxInfo>('POST', '/v1/sandboxes', { key, body: { spec: SPEC, ...body } });
const capacity = async (key: string) => CapacityInfoSchema.parse((await t.json<CapacityInfo>('GET', '/v1/capacity', { key })).body);

describe('admission control (issue 16)', () => {
  it('refuses past the tenant quota and the server count at once, waits for room when asked, and leaves no half-made sandbox', async () => {
    const a = t.apiKey;
    const before = await capacity(a);
    expect(before.sandboxes).toEqual({ limit: 3, committed: 0, free: 3 });
    expect(before.tenant).toMatchObject({ tenantId: 'default', limit: 2, free: 2 });

    const a1 = await create(a);
    const a2 = await create(a);
    expect([a1.status, a2.status]).toEqual([201, 201]);
    // Tenant A is at its quota: its own doing, 429, while B still has room.
    const overQuota = await create(a);
    expect(overQuota.status).toBe(429);
    expectError(overQuota.body, 'QUOTA_EXCEEDED');
    expect(overQuota.headers.get('retry-after')).toBe('5');
    const b1 = await create(tenantB);
    expect(b1.status).toBe(201);
    // The server is full: B is refused although B has room in its quota.
    const full = await create(tenantB);
    expect(full.status).toBe(503);
    expectError(full.body, 'CAPACITY_EXHAUSTED');
    expect(full.body).toMatchObject({ details: { resource: 'sandboxes', limit: 3, used: 3 } });
    expect(full.headers.get('retry-after')).toBe('5');
    expect((await capacity(tenantB)).sandboxes.free).toBe(0);
    expect(await (await t.call('GET', '/metrics')).text()).toMatch(/^capsule_capacity_free\{resource="sandboxes"\} 0$/m);

    // A bounded wait that nothing frees ends with the same refusal, saying it waited.
    const waitedOut = await create(tenantB, { waitForCapacityMs: 300 });
    expect(waitedOut.status).toBe(503);
    expect(waitedOut.body).toMatchObject({ code: 'CAPACITY_EXHAUSTED', details: { resource: 'sandboxes', waitedMs: 300 } });

    // A create that waits gets the room of the first sandbox to end.
    const waiting = create(tenantB, { waitForCapacityMs: 60_000 });
    await waitFor(async () => ((await capacity(a)).waiting === 1 ? true : undefined), { timeoutMs: 30_000, what: 'the create waiting for room' });
    expect((await t.call('DELETE', `/v1/sandboxes/${a1.body.sandboxId}`)).status).toBe(200);
    const admitted = await waiting;
    expect(admitted.status).toBe(201);
    expect(admitted.body.state).toBe('running');
    const ran = await readNdjson(await t.call('POST', `/v1/sandboxes/${admitted.body.sandboxId}/processes`, { key: tenantB, body: { argv: ['echo', 'admitted'] } }));
    expect(ran.at(-1)).toMatchObject({ type: 'exit', result: { exitCode: 0, stdout: 'admitted\n' } });

    // Refused creates made nothing: each tenant has exactly the sandboxes it was given.
    const listed = async (key: string) => (await t.json<{ sandboxes: SandboxInfo[] }>('GET', '/v1/sandboxes', { key })).body.sandboxes.map((s) => `${s.sandboxId}:${s.state}`).sort();
    expect(await listed(a)).toEqual([`${a1.body.sandboxId}:killed`, `${a2.body.sandboxId}:running`].sort());
    expect(await listed(tenantB)).toEqual([`${b1.body.sandboxId}:running`, `${admitted.body.sandboxId}:running`].sort());
    const after = await capacity(tenantB);
    expect(after).toMatchObject({ sandboxes: { committed: 3, free: 0 }, tenant: { tenantId: 'capacity-b', committed: 2, free: 0 }, waiting: 0 });

    for (const [key, id] of [[a, a2.body.sandboxId], [tenantB, b1.body.sandboxId], [tenantB, admitted.body.sandboxId]] as const) {
      expect((await t.call('DELETE', `/v1/sandboxes/${id}`, { key })).status).toBe(200);
    }
    expect((await capacity(a)).sandboxes).toEqual({ limit: 3, committed: 0, free: 3 });
  });

  it('the SDK reports the refusal as UnavailableError without retrying it, and reads the capacity', async () => {
    const conn = { url: t.url, apiKey: tenantB };
    const held = await Promise.all([Sandbox.create(SPEC, conn), Sandbox.create(SPEC, conn), Sandbox.create(SPEC, { url: t.url, apiKey: t.apiKey })]);
    try {
      const info = await Sandbox.capacity(conn);
      expect(info.sandboxes.free).toBe(0);
      expect(info.memory.limitBytes).toBe((info.memory.hostBytes - info.memory.reserveBytes) * info.memory.overcommit);
      const refusals = async () => Number(/^capsule_api_requests_total\{route="\/v1\/sandboxes",method="POST",status="503"\} (\d+)$/m.exec(await (await t.call('GET', '/metrics')).text())?.[1] ?? 0);
      const refusedBefore = await refusals();
      const error = await Sandbox.create(SPEC, { url: t.url, apiKey: t.apiKey, waitForCapacityMs: 200 }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(UnavailableError);
      expect(error).toMatchObject({ code: 'CAPACITY_EXHAUSTED', details: { waitedMs: 200 } });
      expect(await refusals()).toBe(refusedBefore + 1); // one request: the SDK did not try again
    } finally {
      await Promise.all(held.map((s) => s.kill()));
    }
  });
});
