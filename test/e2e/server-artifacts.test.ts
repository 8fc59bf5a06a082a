import { createHash } from 'node:crypto';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { expectNoLeaks } from '../helpers/sandbox.js';
import { expectError, readNdjson, startTestServer, waitFor, type TestServer } from './server-helpers.js';

type Ref = { name: string; path: string; size?: number; sha256?: string; uri?: string; skipped?: string };

let t: TestServer;
beforeAll(async () => {
  t = await startTestServer();
});
afterAll(async () => {
  await t.server.close();
  await expectNoLeaks();
});
afterEach(async () => {
  const { body } = await t.json<{ sandboxes: { sandboxId: string }[] }>('GET', '/v1/sandboxes?state=starting,running,paused&limit=100');
  for (const s of body.sandboxes) await t.call('DELETE', `/v1/sandboxes/${s.sandboxId}`);
  await expectNoLeaks();
});

async function create(): Promise<string> {
  const r = await t.json<{ sandboxId: string }>('POST', '/v1/sandboxes', { body: { spec: { ttlMs: 120_000 } } });
  expect(r.status, JSON.stringify(r.body)).toBe(201);
  return r.body.sandboxId;
}

async function exec(id: string, body: Record<string, unknown>): Promise<{ pid: number; result: Record<string, unknown> }> {
  const response = await t.call('POST', `/v1/sandboxes/${id}/processes`, { body });
  expect(response.status).toBe(200);
  const events = await readNdjson(response);
  const start = events[0] as { type: string; pid: number };
  const exit = events.at(-1) as { type: string; result: Record<string, unknown> };
  expect(exit.type, JSON.stringify(exit)).toBe('exit');
  return { pid: start.pid, result: exit.result };
}

async function sha256Of(response: Response): Promise<{ sha256: string; size: number }> {
  const hash = createHash('sha256');
  let size = 0;
  for await (const chunk of response.body as AsyncIterable<Uint8Array>) {
    hash.update(chunk);
    size += chunk.length;
  }
  return { sha256: hash.digest('hex'), size };
}

describe('artifacts over HTTP', () => {
  it('collects a 50 MiB file on demand and downloads it intact; the artifact outlives the sandbox', async () => {
    const id = await create();
    const made = await exec(id, { argv: ['sh', '-c', 'mkdir -p output && head -c 52428800 /dev/urandom > output/big.bin && sha256sum output/big.bin'] });
    const inside = String(made.result.stdout).split(' ')[0];
    const collected = await t.json<{ artifacts: Ref[]; truncated: boolean }>('POST', `/v1/sandboxes/${id}/artifacts`, { body: {} });
    expect(collected.status, JSON.stringify(collected.body)).toBe(200);
    expect(collected.body.truncated).toBe(false);
    expect(collected.body.artifacts).toEqual([expect.objectContaining({ name: 'big.bin', path: '/workspace/output/big.bin', size: 52428800, sha256: inside, uri: `capsule://artifacts/${inside}` })]);

    expect((await t.call('DELETE', `/v1/sandboxes/${id}`)).status).toBe(200);
    const download = await t.call('GET', `/v1/artifacts/${inside}`);
    expect(download.status).toBe(200);
    expect(download.headers.get('content-type')).toBe('application/octet-stream');
    expect(await sha256Of(download)).toEqual({ sha256: inside, size: 52428800 });

    const listed = await t.json<{ artifacts: { sha256: string; sandboxId: string }[] }>('GET', `/v1/artifacts?sandboxId=${id}`);
    expect(listed.body.artifacts).toEqual([expect.objectContaining({ sha256: inside, sandboxId: id })]);

    expect((await t.call('DELETE', `/v1/artifacts/${inside}`)).status).toBe(204);
    expectError((await t.json('GET', `/v1/artifacts/${inside}`)).body, 'NOT_FOUND');
  });

  it('skips and flags an over-cap file, reports a symlink to a host file without following it, and hides artifacts from other tenants', async () => {
    const id = await create();
    await exec(id, { argv: ['sh', '-c', 'mkdir -p out && head -c 2000000 /dev/zero > out/big && echo hi > out/small && ln -s /etc/passwd out/link'] });
    const collected = await t.json<{ artifacts: Ref[]; truncated: boolean }>('POST', `/v1/sandboxes/${id}/artifacts`, { body: { dir: '/workspace/out', maxFileBytes: 1024 * 1024 } });
    expect(collected.status, JSON.stringify(collected.body)).toBe(200);
    const byName = new Map(collected.body.artifacts.map((a) => [a.name, a]));
    expect(byName.get('big')).toEqual({ name: 'big', path: '/workspace/out/big', size: 2000000, skipped: 'too_large' });
    expect(byName.get('link')).toMatchObject({ skipped: 'symlink' });
    const small = byName.get('small')!;
    expect(small).toMatchObject({ size: 3, sha256: createHash('sha256').update('hi\n').digest('hex') });

    const minted = await t.json<{ apiKey: string }>('POST', '/v1/keys', { body: { tenantId: 'other-tenant' } });
    expect(minted.status).toBe(201);
    const other = minted.body.apiKey;
    expectError((await t.json('GET', `/v1/artifacts/${small.sha256}`, { key: other })).body, 'NOT_FOUND');
    expect((await t.json('GET', `/v1/artifacts/${small.sha256}`, { key: other })).status).toBe(404);
    expect((await t.json('DELETE', `/v1/artifacts/${small.sha256}`, { key: other })).status).toBe(404);
    expect((await t.json<{ artifacts: unknown[] }>('GET', `/v1/artifacts?sandboxId=${id}`, { key: other })).body.artifacts).toEqual([]);
    expect((await t.json('POST', `/v1/sandboxes/${id}/artifacts`, { key: other, body: {} })).status).toBe(404);
    expect(await (await t.call('GET', `/v1/artifacts/${small.sha256}`)).text()).toBe('hi\n');

    expectError((await t.json('POST', `/v1/sandboxes/${id}/artifacts`, { body: { dir: '/etc' } })).body, 'INVALID_PATH');
    expectError((await t.json('GET', '/v1/artifacts/not-a-digest')).body, 'NOT_FOUND');
  });

  it('a foreground exec with collectArtifacts carries the references in its exit result', async () => {
    const id = await create();
    const { result } = await exec(id, { argv: ['sh', '-c', 'mkdir -p output && printf report > output/r.txt'], collectArtifacts: {} });
    expect(result.outcome).toBe('ok');
    expect(result.artifacts).toEqual([expect.objectContaining({ name: 'r.txt', size: 6, sha256: createHash('sha256').update('report').digest('hex') })]);
    expect(result.artifactsTruncated).toBe(false);
  });
});

describe('process output logs', () => {
  it('keeps the full output of a process beyond the stdout cap, retrievable by pid', async () => {
    const r = await t.json<{ sandboxId: string }>('POST', '/v1/sandboxes', { body: { spec: { limits: { stdoutBytes: 1024 } } } });
    const id = r.body.sandboxId;
    const { pid, result } = await exec(id, { argv: ['sh', '-c', 'head -c 100000 /dev/zero | tr "\\0" a; echo oops >&2'] });
    expect(result.stdoutTruncated).toBe(true);
    const response = await t.call('GET', `/v1/sandboxes/${id}/processes/${pid}/log`);
    expect(response.status).toBe(200);
    expect(response.headers.get('content-type')).toMatch(/^application\/x-ndjson/);
    const lines = (await readNdjson(response)) as { t: number; stream: string; data: string }[];
    const stdout = Buffer.concat(lines.filter((l) => l.stream === 'stdout').map((l) => Buffer.from(l.data, 'base64')));
    const stderr = Buffer.concat(lines.filter((l) => l.stream === 'stderr').map((l) => Buffer.from(l.data, 'base64')));
    expect(stdout.length).toBe(100000);
    expect(stderr.toString()).toBe('oops\n');

    expectError((await t.json('GET', `/v1/sandboxes/${id}/processes/99999/log`)).body, 'PROCESS_NOT_FOUND');
    // Kept after the sandbox ends (removed an hour later by the sweep).
    await t.call('DELETE', `/v1/sandboxes/${id}`);
    expect((await t.call('GET', `/v1/sandboxes/${id}/processes/${pid}/log`)).status).toBe(200);
  });

  it('shows the output of a running process so far, then all of it after the exit', async () => {
    const r = await t.json<{ sandboxId: string }>('POST', '/v1/sandboxes', { body: {} });
    const id = r.body.sandboxId;
    try {
      // The process prints, then waits for a file the test writes: it is running while read.
      const started = await t.json<{ pid: number }>('POST', `/v1/sandboxes/${id}/processes`, {
        body: { argv: ['sh', '-c', 'echo early; while [ ! -e go ]; do sleep 0.02; done; echo late'], background: true },
      });
      expect(started.status).toBe(201);
      const log = async (): Promise<string> => {
        const response = await t.call('GET', `/v1/sandboxes/${id}/processes/${started.body.pid}/log`);
        if (response.status !== 200) return '';
        const lines = (await readNdjson(response)) as { data: string }[];
        return Buffer.concat(lines.map((l) => Buffer.from(l.data, 'base64'))).toString();
      };
      expect(await waitFor(async () => ((await log()) === 'early\n' ? true : undefined), { timeoutMs: 10_000, what: 'the early line in the log' })).toBe(true);
      await exec(id, { argv: ['touch', 'go'] });
      expect(await waitFor(async () => ((await log()) === 'early\nlate\n' ? true : undefined), { timeoutMs: 10_000, what: 'the whole log' })).toBe(true);
    } finally {
      await t.call('DELETE', `/v1/sandboxes/${id}`);
    }
  });
});
