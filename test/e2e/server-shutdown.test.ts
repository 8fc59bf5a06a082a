import { mkdtempSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { startServer } from '../../src/server/bootstrap.js';
import { openDatabase } from '../../src/store/index.js';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';
import { readNdjson, startTestServer } from './server-helpers.js';

afterEach(expectNoLeaks);

describe('graceful shutdown', () => {
  it('ends running streams, kills sandboxes, refuses new connections, and keeps the records', async () => {
    const t = await startTestServer();
    const s = await t.json<{ sandboxId: string }>('POST', '/v1/sandboxes', { body: {} });
    const id = s.body.sandboxId;
    const exec = await t.call('POST', `/v1/sandboxes/${id}/processes`, { body: { argv: ['sleep', '30'] } });
    const bg = await t.json<{ pid: number }>('POST', `/v1/sandboxes/${id}/processes`, { body: { argv: ['sleep', '30'], background: true } });
    const reattached = await t.call('GET', `/v1/sandboxes/${id}/processes/${bg.body.pid}/events`);
    const watch = await t.call('GET', `/v1/sandboxes/${id}/files/watch?path=/workspace`);
    expect(watch.status).toBe(200);

    await t.server.close();

    // Each stream ends: the processes with their exit, killed by the close (a close that waited
    // for them would end with `sleep 30` exiting 0), and the watch closes.
    // The close kills the sandbox's cgroup and its agent together: a process's end is reported
    // as SIGKILL when the agent saw it die first, else as the sandbox lost around it. Either way
    // it did not run to its end.
    const killed = (event: Record<string, unknown> | undefined) => {
      expect(event).toMatchObject({ type: 'exit', result: { exitCode: null } });
      const result = (event as { result: { signal: string | null; outcome: string; error?: { code: string } } }).result;
      if (result.signal !== 'SIGKILL') expect(result).toMatchObject({ outcome: 'error', error: { code: expect.stringMatching(/^(SANDBOX_CRASHED|ABORTED)$/) as unknown } });
    };
    killed((await readNdjson(exec)).at(-1));
    killed((await readNdjson(reattached)).at(-1));
    await watch.text().catch(() => '');
    await expect(fetch(`${t.url}/healthz`)).rejects.toThrow();

    // The record outlives the server: state killed, with the reason.
    const db = openDatabase(t.server.db.name.replace(/\/capsule\.db$/, ''));
    try {
      const row = db.prepare('SELECT info FROM sandboxes WHERE sandbox_id = ?').get(id) as { info: string };
      expect(JSON.parse(row.info)).toMatchObject({ state: 'killed', endReason: expect.stringMatching(/shut down/) as unknown });
    } finally {
      db.close();
    }
  });
});

describe('the operator key', () => {
  it('is generated once when CAPSULE_API_KEY is unset, and still works after a restart', async () => {
    const databaseDir = mkdtempSync(join(testDataDir(), 'server-key-'));
    const first = await startServer({ dataDir: testDataDir(), databaseDir, port: 0, env: {} });
    const key = first.generatedApiKey;
    try {
      expect(first.apiKeySource).toBe('generated');
      expect(key).toMatch(/^cap_[0-9a-f]{40}$/);
      expect((await fetch(`${first.url}/v1/sandboxes`, { headers: { authorization: `Bearer ${key}` } })).status).toBe(200);
    } finally {
      await first.close();
    }
    const second = await startServer({ dataDir: testDataDir(), databaseDir, port: 0, env: {} });
    try {
      expect(second.apiKeySource).toBe('existing');
      expect(second.generatedApiKey).toBeUndefined();
      expect((await fetch(`${second.url}/v1/sandboxes`, { headers: { authorization: `Bearer ${key}` } })).status).toBe(200);
    } finally {
      await second.close();
    }
    await expect(startServer({ dataDir: testDataDir(), databaseDir, port: 0, env: { CAPSULE_API_KEY: 'hunter2' } })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
  });
});

describe('one server per data directory', () => {
  it('refuses a second server on a data dir in use (it would reconcile away the first one’s sandboxes)', async () => {
    const t = await startTestServer();
    try {
      const s = await t.json<{ sandboxId: string }>('POST', '/v1/sandboxes', { body: {} });
      await expect(startServer({ dataDir: testDataDir(), databaseDir: mkdtempSync(join(testDataDir(), 'server-two-')), port: 0, env: {} })).rejects.toMatchObject({
        code: 'HOST_NOT_READY',
      });
      expect((await t.json<{ state: string }>('GET', `/v1/sandboxes/${s.body.sandboxId}`)).body.state).toBe('running');
    } finally {
      await t.server.close();
    }
  });
});
