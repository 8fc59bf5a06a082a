import { Sandbox } from 'e2b';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startE2bServer, type E2bTestServer } from './e2b-harness.js';
import { startTestServer } from './server-helpers.js';
import { clampLimits, DEFAULT_MAXIMA } from '../../src/sandbox-spec/index.js';

/**
 * The E2B facade goes through the same seam as /v1 (decision 008): its mutating calls take an
 * Idempotency-Key and are audited with the claim and the outcome committed together.
 */
let t: E2bTestServer;

beforeAll(async () => {
  t = await startE2bServer();
});

afterAll(async () => {
  await t.server.close();
});

interface AuditRow {
  operation: string;
  phase: string;
  sandboxId: string | null;
  outcome: string | null;
  attemptSeq: number | null;
  seq: number;
  keyId: string | null;
}

async function auditRecords(): Promise<AuditRow[]> {
  return (await t.json<{ records: AuditRow[] }>('GET', '/v1/audit?limit=1000')).body.records;
}

const e2bCall = (method: string, path: string, body?: unknown, headers: Record<string, string> = {}) =>
  fetch(`${t.url}${path}`, {
    method,
    headers: { 'x-api-key': t.e2bKey, ...(body === undefined ? {} : { 'content-type': 'application/json' }), ...headers },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });

describe('the E2B control plane through the seam', () => {
  it('creates once per Idempotency-Key: a retry replays the first answer and makes no second sandbox', async () => {
    const headers = { 'idempotency-key': 'e2b-create-1' };
    const first = await e2bCall('POST', '/sandboxes', { templateID: 'base', timeout: 60 }, headers);
    expect(first.status).toBe(201);
    const created = (await first.json()) as { sandboxID: string };
    const again = await e2bCall('POST', '/sandboxes', { templateID: 'base', timeout: 60 }, headers);
    expect(again.status).toBe(201);
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(((await again.json()) as { sandboxID: string }).sandboxID).toBe(created.sandboxID);
    const listed = (await (await e2bCall('GET', '/v2/sandboxes')).json()) as { sandboxID: string }[];
    expect(listed.filter((s) => s.sandboxID === created.sandboxID)).toHaveLength(1);
    expect(listed).toHaveLength(1);

    // The same key with another body is refused, in E2B's error shape.
    const reused = await e2bCall('POST', '/sandboxes', { templateID: 'base', timeout: 61 }, headers);
    expect(reused.status).toBe(409);
    expect(await reused.json()).toMatchObject({ code: 409, message: expect.stringMatching(/Idempotency-Key/i) as unknown });

    // The create is in the audit chain: one attempt and one outcome naming the sandbox.
    const records = (await auditRecords()).filter((r) => r.operation === 'e2b.sandboxes.create');
    const attempts = records.filter((r) => r.phase === 'attempt');
    const outcomes = records.filter((r) => r.phase === 'outcome');
    expect(attempts).toHaveLength(1); // the replay and the refused reuse write nothing
    expect(outcomes.find((r) => r.sandboxId === created.sandboxID)).toMatchObject({ outcome: 'ok' });
    await e2bCall('DELETE', `/sandboxes/${created.sandboxID}`);
  });

  it('replays a stored failure in E2B\'s shape and audits it', async () => {
    const headers = { 'idempotency-key': 'e2b-create-unknown-template' };
    const first = await e2bCall('POST', '/sandboxes', { templateID: 'no-such-template' }, headers);
    expect(first.status).toBe(404);
    const body = await first.json();
    const again = await e2bCall('POST', '/sandboxes', { templateID: 'no-such-template' }, headers);
    expect(again.status).toBe(404);
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(await again.json()).toEqual(body);
    const failed = (await auditRecords()).filter((r) => r.operation === 'e2b.sandboxes.create' && r.phase === 'outcome' && r.outcome === 'TEMPLATE_NOT_FOUND');
    expect(failed).toHaveLength(1);
  });

  it('audits data-plane calls of the official SDK: a command start records its exit as the outcome', async () => {
    const sandbox = await Sandbox.create(t.opts);
    try {
      const result = await sandbox.commands.run('sh -c "exit 3"').catch((error: { exitCode?: number }) => error);
      expect(result.exitCode).toBe(3);
      await sandbox.files.write('/home/user/a.txt', 'hello');
      const records = await auditRecords();
      const start = records.filter((r) => r.operation === 'e2b.process.start' && r.sandboxId === sandbox.sandboxId);
      expect(start.map((r) => r.phase)).toEqual(['attempt', 'outcome']);
      expect(start[1]).toMatchObject({ outcome: 'ok', keyId: 'e2b-access-token', attemptSeq: start[0]?.seq });
      const write = records.filter((r) => r.operation === 'e2b.files.write' && r.sandboxId === sandbox.sandboxId);
      expect(write.map((r) => r.phase)).toEqual(['attempt', 'outcome']);
    } finally {
      await sandbox.kill();
    }
  });
});

describe('E2B sizes within the operator maxima, computed', () => {
  it('clampLimits lowers only what is above a maximum', () => {
    const maxima = { ...DEFAULT_MAXIMA, limits: { ...DEFAULT_MAXIMA.limits, memoryBytes: 256 * 2 ** 20, cpus: 1 } };
    expect(clampLimits({ memoryBytes: 512 * 2 ** 20, cpus: 2, pids: 64 }, maxima)).toEqual({ memoryBytes: 256 * 2 ** 20, cpus: 1, pids: 64 });
  });

  it('an E2B sandbox on a server with low maxima gets the maxima, in one create', async () => {
    await t.server.close(); // one server per data directory
    const low = await startTestServer({ maxima: { ...DEFAULT_MAXIMA, limits: { ...DEFAULT_MAXIMA.limits, memoryBytes: 256 * 2 ** 20, cpus: 1 } } });
    try {
      const e2bKey = `e2b_${low.apiKey.slice('cap_'.length)}`;
      const created = await fetch(`${low.url}/sandboxes`, { method: 'POST', headers: { 'x-api-key': e2bKey, 'content-type': 'application/json' }, body: '{}' });
      expect(created.status).toBe(201);
      const { sandboxID } = (await created.json()) as { sandboxID: string };
      const info = await low.json<{ spec: { limits: { memoryBytes: number; cpus: number } } }>('GET', `/v1/sandboxes/${sandboxID}`);
      expect(info.body.spec.limits).toMatchObject({ memoryBytes: 256 * 2 ** 20, cpus: 1 });
      const attempts = (await low.json<{ records: AuditRow[] }>('GET', '/v1/audit?limit=100')).body.records.filter((r) => r.operation === 'e2b.sandboxes.create');
      expect(attempts.map((r) => r.phase)).toEqual(['attempt', 'outcome']);
    } finally {
      await low.server.close();
    }
  });
});
