import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import {
  ArtifactCollectionSchema,
  AuditRecordSchema,
  CodeEventSchema,
  ContextInfoSchema,
  ErrorBodySchema,
  FileEntrySchema,
  LogLineSchema,
  ProcessEventSchema,
  ProcessInfoSchema,
  SandboxInfoSchema,
  SandboxPageSchema,
  StoredArtifactSchema,
  UsageSampleSchema,
} from '../../src/wire/index.js';
import { readNdjson, startTestServer, type TestServer } from './server-helpers.js';

/**
 * The drift test of the wire contract (docs/decisions/006-wire-contract.md): real replies of a
 * real server, validated against the schemas in src/wire. A schema strips keys it does not know,
 * so "parses and equals the reply" fails both on a missing field and on one the contract lacks.
 */
function expectExactly<T>(schema: z.ZodType<T>, value: unknown): void {
  const parsed = schema.safeParse(value);
  if (!parsed.success) throw new Error(`reply does not match the contract: ${parsed.error.message}\n${JSON.stringify(value)}`);
  expect(parsed.data).toEqual(value);
}

let t: TestServer;
let sandboxId: string;

beforeAll(async () => {
  t = await startTestServer();
  const created = await t.json('POST', '/v1/sandboxes', { body: { metadata: { purpose: 'wire' } } });
  expect(created.status).toBe(201);
  sandboxId = String(created.body.sandboxId);
});

afterAll(async () => {
  await t.server.close();
});

describe('the wire contract holds for real replies', () => {
  it('sandbox info, pages and errors', async () => {
    expectExactly(SandboxInfoSchema, (await t.json('GET', `/v1/sandboxes/${sandboxId}`)).body);
    expectExactly(SandboxPageSchema, (await t.json('GET', '/v1/sandboxes?limit=5')).body);
    const missing = await t.json('GET', '/v1/sandboxes/aaaaaaaaaaaaaaaaaaaa');
    expect(missing.status).toBe(404);
    expectExactly(ErrorBodySchema, missing.body);
  });

  it('a foreground exec stream, a failing one with its diagnostic, the process list and the log', async () => {
    for (const argv of [['sh', '-c', 'echo out; echo err >&2'], ['sh', '-c', 'echo boom >&2; exit 3']]) {
      const response = await t.call('POST', `/v1/sandboxes/${sandboxId}/processes`, { body: { argv } });
      const events = await readNdjson(response);
      expect(events.at(-1)?.type).toBe('exit');
      for (const event of events) expectExactly(ProcessEventSchema, event);
    }
    const listed = await t.json<{ processes: unknown[] }>('GET', `/v1/sandboxes/${sandboxId}/processes`);
    expect(listed.body.processes.length).toBeGreaterThan(0);
    for (const process of listed.body.processes) expectExactly(ProcessInfoSchema, process);
    const pid = (listed.body.processes[0] as { pid: number }).pid;
    const log = await readNdjson(await t.call('GET', `/v1/sandboxes/${sandboxId}/processes/${pid}/log`));
    expect(log.length).toBeGreaterThan(0);
    for (const line of log) expectExactly(LogLineSchema, line);
  });

  it('files, artifacts and usage', async () => {
    const written = await t.json('PUT', `/v1/sandboxes/${sandboxId}/files?path=output/a.txt`, { raw: 'hello', headers: { 'content-type': 'application/octet-stream' } });
    expect(written.status).toBe(200);
    expectExactly(FileEntrySchema, written.body);
    const listed = await t.json<{ entries: unknown[] }>('GET', `/v1/sandboxes/${sandboxId}/files/list?path=output`);
    for (const entry of listed.body.entries) expectExactly(FileEntrySchema, entry);
    const collected = await t.json('POST', `/v1/sandboxes/${sandboxId}/artifacts`, { body: {} });
    expectExactly(ArtifactCollectionSchema, collected.body);
    const stored = await t.json<{ artifacts: unknown[] }>('GET', `/v1/artifacts?sandboxId=${sandboxId}`);
    expect(stored.body.artifacts.length).toBe(1);
    for (const artifact of stored.body.artifacts) expectExactly(StoredArtifactSchema, artifact);
    const usage = await t.json<{ samples: unknown[] }>('GET', `/v1/sandboxes/${sandboxId}/metrics`);
    expect(usage.body.samples.length).toBeGreaterThan(0);
    for (const sample of usage.body.samples) expectExactly(UsageSampleSchema, sample);
  });

  it('interpreter contexts and code events', async () => {
    const context = await t.json('POST', `/v1/sandboxes/${sandboxId}/contexts`, { body: { language: 'js' } });
    expect(context.status).toBe(201);
    expectExactly(ContextInfoSchema, context.body);
    const response = await t.call('POST', `/v1/sandboxes/${sandboxId}/code`, { body: { code: 'console.log(1); 6 * 7', contextId: context.body.id } });
    const events = await readNdjson(response);
    expect(events.at(-1)?.type).toBe('end');
    for (const event of events) expectExactly(CodeEventSchema, event);
  });

  it('audit records', async () => {
    const audit = await t.json<{ records: unknown[] }>('GET', '/v1/audit?limit=20');
    expect(audit.body.records.length).toBeGreaterThan(0);
    for (const record of audit.body.records) expectExactly(AuditRecordSchema, record);
  });
});
