import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { expectNoLeaks } from '../helpers/sandbox.js';
import { startE2bServer, type E2bTestServer } from './e2b-harness.js';
import { expectError, readNdjson } from './server-helpers.js';

/**
 * Interpreter contexts over HTTP (POST /v1/sandboxes/{id}/code, /contexts) on real sandboxes, and
 * the E2B facade's code interpreter sharing the same contexts. Each test has its own sandbox and
 * runs several cases in it: a kernel takes a second or two to start.
 */
const MiB = 1024 * 1024;
// Each case starts interpreter contexts (a Node or Python process each, some restarted): 15 s
// on a quiet machine, over 60 s when the 2 cores are shared with other test runs.
const INTERPRETER_TEST_MS = 240_000;
let t: E2bTestServer;

beforeAll(async () => {
  t = await startE2bServer();
});
afterAll(async () => {
  await t?.server.close();
});
afterEach(expectNoLeaks);

type Event = Record<string, unknown> & { type: string };

interface Run {
  events: Event[];
  stdout: string;
  execution: Record<string, unknown> & { contextId: string; limit?: { resource: string; message: string } };
}

async function withSandbox(test: (sandboxId: string) => Promise<void>, memoryBytes = 1024 * MiB): Promise<void> {
  const created = await t.json<{ sandboxId: string }>('POST', '/v1/sandboxes', {
    body: { spec: { ttlMs: 120_000, limits: { memoryBytes, wallClockMs: 20_000 } } },
  });
  expect(created.status).toBe(201);
  const id = created.body.sandboxId;
  try {
    await test(id);
  } catch (error) {
    (error as Error).message = `[sandbox ${id}] ${(error as Error).message}`;
    throw error;
  } finally {
    await t.call('DELETE', `/v1/sandboxes/${id}`);
  }
}

async function run(sandboxId: string, body: object): Promise<Run> {
  const response = await t.call('POST', `/v1/sandboxes/${sandboxId}/code`, { body });
  expect(response.status).toBe(200);
  expect(response.headers.get('content-type')).toMatch(/^application\/x-ndjson/);
  const events = (await readNdjson(response)) as Event[];
  const end = events.at(-1);
  expect(end?.type, JSON.stringify(events)).toBe('end');
  return {
    events,
    stdout: events.filter((e) => e.type === 'stdout').map((e) => e.text as string).join(''),
    execution: end?.execution as Run['execution'],
  };
}

async function createContext(sandboxId: string, body: object): Promise<string> {
  const created = await t.json<{ id: string; language: string; cwd: string }>('POST', `/v1/sandboxes/${sandboxId}/contexts`, { body });
  expect(created.status, JSON.stringify(created.body)).toBe(201);
  return created.body.id;
}

describe('POST /v1/sandboxes/{id}/code', () => {
  it('python: state across calls, a PNG plot, an exception, per-call env vars, a timeout that keeps state', () =>
    withSandbox(async (id) => {
      const first = await run(id, { code: 'x = 42' });
      expect(first.execution.error).toBeUndefined();
      const second = await run(id, { code: 'print(x * 2)' });
      expect(second.stdout).toBe('84\n');
      expect(second.events.map((e) => e.type)).toEqual(['stdout', 'executionCount', 'end']);
      expect(second.execution.contextId).toBe(first.execution.contextId);
      expect(second.execution.contextId).toMatch(/^py-/);

      const value = await run(id, { code: 'x + 1', language: 'python' });
      expect(value.events.find((e) => e.type === 'result')).toMatchObject({ result: { text: '43', isMainResult: true } });

      const plot = await run(id, { code: 'import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()' });
      const png = plot.events.map((e) => (e.result as { png?: string } | undefined)?.png).find((p) => p !== undefined);
      expect(Buffer.from(png ?? '', 'base64').subarray(0, 8)).toEqual(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]));

      const table = await run(id, { code: 'import pandas as pd\npd.DataFrame({"a": [1, 2]})' });
      expect(table.events.find((e) => e.type === 'result')).toMatchObject({ result: { html: expect.stringContaining('<table') as unknown, isMainResult: true } });

      const failed = await run(id, { code: '1 / 0' });
      const error = failed.events.find((e) => e.type === 'error')?.error as { name: string; value: string; traceback: string };
      expect(error).toMatchObject({ name: 'ZeroDivisionError', value: 'division by zero' });
      expect(error.traceback).toContain('ZeroDivisionError');
      expect(failed.execution.error).toEqual(error);
      expect((await run(id, { code: 'print(x)' })).stdout).toBe('42\n');

      const env = await run(id, { code: 'import os\nprint(os.environ.get("GREETING"))', envVars: { GREETING: 'hi' } });
      expect(env.stdout).toBe('hi\n');
      expect((await run(id, { code: 'print(os.environ.get("GREETING"))' })).stdout).toBe('None\n');

      const slow = await run(id, { code: 'y = 1\nimport time\nwhile True:\n    time.sleep(0.05)', timeoutMs: 1000 });
      expect(slow.execution.limit).toMatchObject({ resource: 'wall_clock' });
      expect(slow.execution.limit?.message).toContain(slow.execution.contextId);
      expect((await run(id, { code: 'print(x, y)' })).stdout).toBe('42 1\n');
    }), INTERPRETER_TEST_MS);

  it('js and contexts: state, independent contexts, restart, delete, errors, and the E2B facade sees them', () =>
    withSandbox(async (id) => {
      const js = await createContext(id, { language: 'js' });
      const other = await createContext(id, { language: 'js' });
      expect((await run(id, { code: 'const x = 42', contextId: js })).execution.error).toBeUndefined();
      expect((await run(id, { code: 'console.log(x * 2)', contextId: js })).stdout).toBe('84\n');
      expect((await run(id, { code: 'typeof x', contextId: other })).events.find((e) => e.type === 'result')).toMatchObject({
        result: { text: "'undefined'" },
      });

      const listed = await t.json<{ contexts: { id: string; language: string; cwd: string }[] }>('GET', `/v1/sandboxes/${id}/contexts`);
      expect(listed.body.contexts).toEqual(
        expect.arrayContaining([
          { id: js, language: 'js', cwd: '/workspace' },
          { id: other, language: 'js', cwd: '/workspace' },
        ]),
      );

      // The E2B code interpreter (port 49999) runs in the context the v1 API created, and back.
      const e2bSandbox = await t.json<{ envdAccessToken?: string }>('GET', `/sandboxes/${id}`, { key: null, headers: { 'x-api-key': t.e2bKey } });
      expect(e2bSandbox.status).toBe(200);
      const e2b = { 'e2b-sandbox-id': id, 'e2b-sandbox-port': '49999', 'content-type': 'application/json', ...(e2bSandbox.body.envdAccessToken ? { 'x-access-token': e2bSandbox.body.envdAccessToken } : {}) };
      const executed = await fetch(`${t.url}/execute`, { method: 'POST', headers: e2b, body: JSON.stringify({ code: 'x + 1', context_id: js }) });
      expect(executed.status).toBe(200);
      expect(await readNdjson(executed)).toContainEqual(expect.objectContaining({ type: 'result', text: '43' }));
      const e2bContext = (await (await fetch(`${t.url}/contexts`, { method: 'POST', headers: e2b, body: JSON.stringify({ language: 'python' }) })).json()) as { id: string };
      await fetch(`${t.url}/execute`, { method: 'POST', headers: e2b, body: JSON.stringify({ code: 'z = 7', context_id: e2bContext.id }) }).then((r) => r.text());
      expect((await run(id, { code: 'print(z)', contextId: e2bContext.id })).stdout).toBe('7\n');

      const restarted = await t.call('POST', `/v1/sandboxes/${id}/contexts/${js}/restart`);
      expect(restarted.status).toBe(204);
      expect((await run(id, { code: 'typeof x', contextId: js })).events.find((e) => e.type === 'result')).toMatchObject({ result: { text: "'undefined'" } });

      expect((await t.call('DELETE', `/v1/sandboxes/${id}/contexts/${other}`)).status).toBe(204);
      const gone = await t.json('POST', `/v1/sandboxes/${id}/code`, { body: { code: '1', contextId: other } });
      expect(gone.status).toBe(404);
      expectError(gone.body, 'NOT_FOUND');
      expectError((await t.json('DELETE', `/v1/sandboxes/${id}/contexts/${other}`)).body, 'NOT_FOUND');
      expectError((await t.json('POST', `/v1/sandboxes/${id}/code`, { body: { code: 1 } })).body, 'INVALID_ARGUMENT');
      expectError((await t.json('POST', `/v1/sandboxes/${id}/contexts`, { body: { language: 'cobol' } })).body, 'INVALID_ARGUMENT');
      expectError((await t.json('POST', `/v1/sandboxes/${id}/code`, { body: { code: '1', contextId: js, language: 'python' } })).body, 'INVALID_ARGUMENT');

      // The audit log holds the code's sha256, never the code.
      const audit = await t.json<{ records: { operation: string; subjectSha256?: string | null }[] }>('GET', '/v1/audit?limit=1000');
      const runs = audit.body.records.filter((r) => r.operation === 'code.run');
      expect(runs.length).toBeGreaterThan(0);
      expect(JSON.stringify(audit.body)).not.toContain('console.log(x * 2)');
    }), INTERPRETER_TEST_MS);

  it('a memory bomb ends the context with a memory limit naming it; the server and sandbox stay healthy', () =>
    withSandbox(async (id) => {
      const context = await createContext(id, { language: 'python' });
      await run(id, { code: 'before = 1', contextId: context });
      const bomb = await run(id, { code: 'chunks = []\nwhile True:\n    chunks.append(b"x" * (16 * 1024 * 1024))', contextId: context });
      expect(bomb.execution.limit).toMatchObject({ resource: 'memory', limit: 256 * MiB });
      expect(bomb.execution.limit?.message).toContain(`context ${context}`);

      // The dead context refuses runs (in the stream: the failure comes after the headers) until restarted.
      const refused = await t.call('POST', `/v1/sandboxes/${id}/code`, { body: { code: '1', contextId: context } });
      expect((await readNdjson(refused)).at(-1)).toMatchObject({ type: 'error', error: { code: 'CONFLICT' } });
      expect((await t.call('POST', `/v1/sandboxes/${id}/contexts/${context}/restart`)).status).toBe(204);
      expect((await run(id, { code: 'print(globals().get("before", "fresh"))', contextId: context })).stdout).toBe('fresh\n');

      expect((await t.json('GET', '/healthz')).status).toBe(200);
      expect((await t.json<{ state: string }>('GET', `/v1/sandboxes/${id}`)).body.state).toBe('running');
    }, 256 * MiB), INTERPRETER_TEST_MS);

  it("answers 404 for another tenant's or an unknown sandbox, 409 for an ended one", async () => {
    expectError((await t.json('POST', '/v1/sandboxes/aaaaaaaaaaaaaaaaaaaa/code', { body: { code: '1' } })).body, 'SANDBOX_NOT_FOUND');
    const other = await t.json<{ apiKey: string }>('POST', '/v1/keys', { body: { tenantId: 'someone-else' } });
    expect(other.status).toBe(201);
    let ended = '';
    await withSandbox(async (id) => {
      ended = id;
      const foreign = await t.json('POST', `/v1/sandboxes/${id}/code`, { body: { code: '1' }, key: other.body.apiKey });
      expect(foreign.status).toBe(404);
      expectError(foreign.body, 'SANDBOX_NOT_FOUND');
      expectError((await t.json('GET', `/v1/sandboxes/${id}/contexts`, { key: other.body.apiKey })).body, 'SANDBOX_NOT_FOUND');
    });
    const late = await t.json('GET', `/v1/sandboxes/${ended}/contexts`);
    expect(late.status).toBe(409);
    expectError(late.body, 'SANDBOX_NOT_RUNNING');
  });
});
