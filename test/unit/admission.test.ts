import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { Admission } from '../../src/engine/admission.js';
import { AdmissionLedger, PIDS_OUTSIDE_LIMIT } from '../../src/engine/admission-ledger.js';
import { admissionOptions, type AdmissionSettings } from '../../src/engine/admission-settings.js';
import { WorkspaceCapacity } from '../../src/engine/disk-budget.js';
import { isSandboxError, type SandboxError } from '../../src/errors/index.js';
import { retryAfterSeconds } from '../../src/server/errors.js';

const MiB = 1024 * 1024;
const GiB = 1024 * MiB;
const HOST = { memoryBytes: 10 * GiB, pids: 10_000 };

function volume(usableBytes = 100 * GiB) {
  return new WorkspaceCapacity({ measure: () => Promise.resolve({ sizeBytes: usableBytes, usableBytes, backableBytes: usableBytes }) });
}

function admission(settings: AdmissionSettings = {}, disk = volume(), outside = () => ({ sandboxes: 0, memoryBytes: 0, pids: 0 })) {
  return new Admission(admissionOptions({ memoryReserveBytes: 2 * GiB, pidsReserve: 0, ...settings }, HOST, disk, outside));
}

const demand = (tenantId: string, memoryBytes = 1 * GiB, pids = 100, diskBytes = 1 * GiB) => ({ tenantId, memoryBytes, pids, diskBytes });

async function refusal(promise: Promise<unknown>): Promise<SandboxError> {
  try {
    await promise;
  } catch (error) {
    if (isSandboxError(error)) return error;
    throw error;
  }
  throw new Error('expected a refusal');
}

describe('admission arithmetic', () => {
  it('bounds memory by (host − reserve) × overcommit and refuses what does not fit with CAPACITY_EXHAUSTED', async () => {
    const gate = admission({ memoryOvercommit: 1 });
    // 10 GiB host less 2 GiB reserve: eight sandboxes of 1 GiB.
    for (let i = 0; i < 8; i++) (await gate.admit(demand('a'))).settle(`m${i}`);
    const refused = await refusal(gate.admit(demand('a')));
    expect(refused.code).toBe('CAPACITY_EXHAUSTED');
    expect(refused.status).toBe(503);
    expect(refused.details).toMatchObject({ resource: 'memory', limitBytes: 8 * GiB, requestedBytes: GiB, retryAfterS: 5 });
    expect(retryAfterSeconds(refused)).toBe(5);
    expect(refused.hint).toContain('waitForCapacityMs');
    // Twice the room with an overcommit of 2; a smaller limit fits where a larger does not.
    const doubled = admission({ memoryOvercommit: 2 });
    for (let i = 0; i < 16; i++) (await doubled.admit(demand('a'))).settle(`d${i}`);
    await expect(doubled.admit(demand('a', 512 * MiB))).rejects.toMatchObject({ code: 'CAPACITY_EXHAUSTED' });
  });

  it('counts each sandbox\'s pids limit and its launcher against the host\'s task ids', () => {
    const ledger = new AdmissionLedger({ maxSandboxes: 100, maxSandboxesPerTenant: 100, memoryBytes: 100 * GiB, pids: 3 * (128 + PIDS_OUTSIDE_LIMIT) });
    for (let i = 0; i < 3; i++) ledger.hold(`s${i}`, { tenantId: 't', memoryBytes: MiB, pids: 128 });
    expect(ledger.totals().pids).toBe(3 * 130);
    expect(ledger.refusal({ tenantId: 't', memoryBytes: MiB, pids: 128 })?.details).toMatchObject({ resource: 'pids', requested: 130 });
    expect(ledger.release('s0')).toBe(true);
    expect(ledger.release('s0')).toBe(false); // once
    expect(ledger.refusal({ tenantId: 't', memoryBytes: MiB, pids: 128 })).toBeUndefined();
  });

  it("refuses past the server's count with CAPACITY_EXHAUSTED and past the tenant's quota with QUOTA_EXCEEDED, per tenant", async () => {
    const gate = admission({ maxSandboxes: 3, maxSandboxesPerTenant: 2 });
    (await gate.admit(demand('a', MiB, 4, MiB))).settle('s3');
    (await gate.admit(demand('a', MiB, 4, MiB))).settle('s4');
    const quota = await refusal(gate.admit(demand('a', MiB, 4, MiB)));
    expect(quota.code).toBe('QUOTA_EXCEEDED');
    expect(quota.status).toBe(429);
    expect(quota.details).toMatchObject({ resource: 'sandboxes', limit: 2, used: 2 });
    expect(retryAfterSeconds(quota)).toBe(5);
    // Tenant b is not held back by a's quota, only by the server's count.
    (await gate.admit(demand('b', MiB, 4, MiB))).settle('s5');
    const full = await refusal(gate.admit(demand('b', MiB, 4, MiB)));
    expect(full.code).toBe('CAPACITY_EXHAUSTED');
    expect(full.details).toMatchObject({ resource: 'sandboxes', limit: 3, used: 3 });
    expect(() => gate.assertSlots('b', 1)).toThrow(expect.objectContaining({ code: 'CAPACITY_EXHAUSTED' }));
  });

  it('promises the disk limit on the volume in the same step, and a refusal there holds nothing', async () => {
    const disk = volume(3 * GiB);
    const gate = admission({}, disk);
    const first = await gate.admit(demand('a', MiB, 4, 2 * GiB));
    expect(disk.committedBytes).toBe(2 * GiB);
    const refused = await refusal(gate.admit(demand('a', MiB, 4, 2 * GiB)));
    expect(refused.details).toMatchObject({ resource: 'workspace_volume' });
    expect((await gate.describe('a')).sandboxes.committed).toBe(1);
    first.cancel(); // failed before its entry: slot, memory and disk all come back
    expect(disk.committedBytes).toBe(0);
    expect((await gate.describe('a')).sandboxes.committed).toBe(0);
  });

  it('counts the warm pools and reports limits, promises and what is free', async () => {
    const gate = admission({ maxSandboxes: 10, maxSandboxesPerTenant: 4 }, volume(10 * GiB), () => ({ sandboxes: 2, memoryBytes: 1 * GiB, pids: 20 }));
    const one = await gate.admit(demand('a', 1 * GiB, 10, 1 * GiB));
    one.settle('sb1');
    gate.hold('sb1', demand('a', 1 * GiB, 10)); // the engine's entry holds it too: counted once
    const info = await gate.describe('a');
    expect(info.sandboxes).toEqual({ limit: 10, committed: 3, free: 7 });
    expect(info.tenant).toEqual({ tenantId: 'a', limit: 4, committed: 1, free: 3 });
    expect(info.memory).toMatchObject({ limitBytes: 8 * GiB, committedBytes: 2 * GiB, freeBytes: 6 * GiB, hostBytes: 10 * GiB, reserveBytes: 2 * GiB, overcommit: 1 });
    expect(info.pids).toMatchObject({ limit: 10_000, committed: 20 + 10 + PIDS_OUTSIDE_LIMIT, host: 10_000 });
    expect(info.disk).toMatchObject({ committedBytes: 1 * GiB, overcommit: 1 });
    expect(info.waiting).toBe(0);
  });

  it('refuses settings that would promise nothing or more than asked', () => {
    expect(() => admissionOptions({ memoryOvercommit: 0.5 }, HOST, volume(), () => ({ sandboxes: 0, memoryBytes: 0, pids: 0 }))).toThrow(/ratio of 1 or more/);
    expect(() => admissionOptions({ maxSandboxes: 0 }, HOST, volume(), () => ({ sandboxes: 0, memoryBytes: 0, pids: 0 }))).toThrow(/at least 1/);
  });
});

describe('admission queue (fake clock)', () => {
  beforeEach(() => {
    vi.useFakeTimers();
  });
  afterEach(() => {
    vi.useRealTimers();
  });

  it('admits a waiting create when a sandbox ends, first come first served', async () => {
    const gate = admission({ maxSandboxes: 1 });
    gate.hold('running', demand('a'));
    const order: string[] = [];
    const first = gate.admit(demand('a'), { waitMs: 10_000 }).then((admitted) => (order.push('first'), admitted));
    const second = gate.admit(demand('b'), { waitMs: 10_000 }).then((admitted) => (order.push('second'), admitted));
    await vi.advanceTimersByTimeAsync(1000);
    expect(gate.waiting).toBe(2);
    gate.release('running');
    (await first).settle('made-by-first');
    expect(order).toEqual(['first']);
    expect(gate.waiting).toBe(1);
    gate.release('made-by-first');
    (await second).settle('made-by-second');
    expect(order).toEqual(['first', 'second']);
  });

  it('refuses with the same error once the wait is over, saying how long it waited', async () => {
    const gate = admission({ maxSandboxes: 1 });
    gate.hold('running', demand('a'));
    const waiting = refusal(gate.admit(demand('a'), { waitMs: 5000 }));
    await vi.advanceTimersByTimeAsync(4999);
    expect(gate.waiting).toBe(1);
    await vi.advanceTimersByTimeAsync(1);
    const refused = await waiting;
    expect(refused.code).toBe('CAPACITY_EXHAUSTED');
    expect(refused.message).toContain('after waiting 5000 ms');
    expect(refused.details).toMatchObject({ resource: 'sandboxes', waitedMs: 5000, retryAfterS: 5 });
    expect(gate.waiting).toBe(0);
  });

  it("lets a waiter of another tenant pass one held back by its own tenant's quota", async () => {
    const gate = admission({ maxSandboxes: 2, maxSandboxesPerTenant: 1 });
    gate.hold('a1', demand('a'));
    gate.hold('b1', demand('b'));
    const a = refusal(gate.admit(demand('a'), { waitMs: 5000 }));
    let bAdmitted = false;
    const b = gate.admit(demand('b'), { waitMs: 5000 }).then((admitted) => ((bAdmitted = true), admitted));
    gate.release('b1'); // b's slot frees; a is still at its quota
    (await b).settle('b2');
    expect(bAdmitted).toBe(true);
    await vi.advanceTimersByTimeAsync(5000);
    expect((await a).code).toBe('QUOTA_EXCEEDED');
  });

  it('gives up a wait when the caller goes away, and refuses every waiter at close', async () => {
    const gate = admission({ maxSandboxes: 1 });
    gate.hold('running', demand('a'));
    const controller = new AbortController();
    const aborted = gate.admit(demand('a'), { waitMs: 5000, signal: controller.signal }).catch((error: unknown) => error);
    const closing = refusal(gate.admit(demand('a'), { waitMs: 5000 }));
    await vi.advanceTimersByTimeAsync(10);
    controller.abort(new Error('client went away'));
    expect(String(await aborted)).toContain('client went away');
    gate.close();
    expect((await closing).code).toBe('SANDBOX_NOT_RUNNING');
    expect(gate.waiting).toBe(0);
  });

  it("refuses a wait longer than the operator's maximum", async () => {
    const gate = admission({ maxWaitMs: 1000 });
    const refused = await refusal(gate.admit(demand('a'), { waitMs: 1001 }));
    expect(refused.code).toBe('INVALID_ARGUMENT');
    expect(refused.details).toMatchObject({ field: 'waitForCapacityMs', maximum: 1000 });
  });
});
