import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';
import { readNdjson, startTestServer, waitFor, type TestServer } from './server-helpers.js';

/**
 * `capsule serve --log-retention`: an ended sandbox's process logs are kept for the operator's
 * time, not the default hour, and then removed by the sweep (which runs at a quarter of a short
 * retention). A real sandbox on a real server; the removal is awaited by polling with a deadline
 * far above the retention, never timed.
 */
let t: TestServer | undefined;

afterAll(async () => {
  await t?.server.close();
  await expectNoLeaks();
});

describe('the retention of ended sandboxes\' logs', () => {
  it('keeps a log readable after its sandbox ends, then removes it once the operator\'s retention is over', async () => {
    t = await startTestServer({ processLogRetentionMs: 10_000, warmPool: 0 });
    const server = t;
    const created = await server.json<{ sandboxId: string }>('POST', '/v1/sandboxes', { body: {} });
    expect(created.status).toBe(201);
    const { sandboxId } = created.body;
    const events = await readNdjson(await server.call('POST', `/v1/sandboxes/${sandboxId}/processes`, { body: { argv: ['sh', '-c', 'echo kept for a while'] } }));
    const pid = events[0]?.pid as number;
    const logPath = `/v1/sandboxes/${sandboxId}/processes/${pid}/log`;
    expect((await server.call('DELETE', `/v1/sandboxes/${sandboxId}`)).status).toBe(200);

    // Ended, well within the retention (10 s; the read comes at once): its output is still there.
    const kept = await readNdjson(await server.call('GET', logPath));
    expect(kept.map((line) => Buffer.from(line.data as string, 'base64').toString()).join('')).toBe('kept for a while\n');

    // Then the sweep removes it: the log answers 404 and its folder is gone.
    await waitFor(async () => ((await server.call('GET', logPath)).status === 404 ? true : undefined), { timeoutMs: 60_000, what: 'the log removed' });
    expect(existsSync(join(testDataDir(), 'logs', sandboxId))).toBe(false);
  }, 90_000);
});
