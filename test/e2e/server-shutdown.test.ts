import { afterEach, describe, expect, it } from 'vitest';
import { expectNoLeaks } from '../helpers/sandbox.js';
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

    const started = Date.now();
    await t.server.close();
    expect(Date.now() - started).toBeLessThan(10_000);

    // Each stream ends: the processes with their exit (the sandbox was killed), the watch closes.
    expect((await readNdjson(exec)).at(-1)).toMatchObject({ type: 'exit' });
    expect((await readNdjson(reattached)).at(-1)).toMatchObject({ type: 'exit' });
    await watch.text().catch(() => '');
    await expect(fetch(`${t.url}/healthz`)).rejects.toThrow();

    // The record outlives the server: state killed, with the reason.
    const db = (await import('../../src/store/index.js')).openDatabase(t.server.db.name.replace(/\/capsule\.db$/, ''));
    try {
      const row = db.prepare('SELECT info FROM sandboxes WHERE sandbox_id = ?').get(id) as { info: string };
      expect(JSON.parse(row.info)).toMatchObject({ state: 'killed', endReason: expect.stringMatching(/shut down/) as unknown });
    } finally {
      db.close();
    }
  });
});
