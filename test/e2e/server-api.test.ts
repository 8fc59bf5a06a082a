import { createHash, randomBytes } from 'node:crypto';
import { connect } from 'node:net';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { expectNoLeaks } from '../helpers/sandbox.js';
import { expectError, readNdjson, startTestServer, waitFor, type TestServer } from './server-helpers.js';

type Info = { sandboxId: string; state: string; expiresAt: string; endReason?: string; metadata: Record<string, string> };

let t: TestServer;
let logs = '';
beforeAll(async () => {
  t = await startTestServer({ maxSandboxesPerTenant: 4, logger: { level: 'debug', stream: { write: (line: string) => (logs += line) } } });
});
afterAll(async () => {
  await t.server.close();
  await expectNoLeaks();
});
afterEach(async () => {
  // Every test kills what it made; a failed one leaves nothing running either.
  const { body } = await t.json<{ sandboxes: Info[] }>('GET', '/v1/sandboxes?state=starting,running,paused&limit=100');
  for (const s of body.sandboxes) await t.call('DELETE', `/v1/sandboxes/${s.sandboxId}`);
  await expectNoLeaks();
});

async function create(body: unknown = {}, key?: string): Promise<Info> {
  const r = await t.json<Info>('POST', '/v1/sandboxes', { body, key });
  expect(r.status, JSON.stringify(r.body)).toBe(201);
  return r.body;
}

describe('sandboxes over HTTP', () => {
  it('creates, gets, lists with state and metadata filters and pages, and kills', async () => {
    const a = await create({ metadata: { team: 'red', run: '1' } });
    const b = await create({ metadata: { team: 'red', run: '2' } });
    const c = await create({ metadata: { team: 'blue' } });
    expect(a.state).toBe('running');
    expect((await t.json<Info>('GET', `/v1/sandboxes/${a.sandboxId}`)).body).toMatchObject({ sandboxId: a.sandboxId, state: 'running', metadata: { team: 'red', run: '1' } });

    const red = await t.json<{ sandboxes: Info[] }>('GET', '/v1/sandboxes?metadata=team=red&state=running');
    expect(red.body.sandboxes.map((s) => s.sandboxId)).toEqual([a.sandboxId, b.sandboxId]);
    const exact = await t.json<{ sandboxes: Info[] }>('GET', '/v1/sandboxes?metadata=team=red&metadata=run=2');
    expect(exact.body.sandboxes.map((s) => s.sandboxId)).toEqual([b.sandboxId]);

    const first = await t.json<{ sandboxes: Info[]; nextCursor: string | null }>('GET', '/v1/sandboxes?state=running&limit=2');
    expect(first.body.sandboxes).toHaveLength(2);
    const second = await t.json<{ sandboxes: Info[]; nextCursor: string | null }>('GET', `/v1/sandboxes?state=running&limit=2&cursor=${first.body.nextCursor}`);
    expect([...first.body.sandboxes, ...second.body.sandboxes].map((s) => s.sandboxId)).toEqual([a.sandboxId, b.sandboxId, c.sandboxId]);
    expect(second.body.nextCursor).toBeNull();

    const killed = await t.json<Info>('DELETE', `/v1/sandboxes/${c.sandboxId}`);
    expect(killed.body).toMatchObject({ state: 'killed', endReason: expect.any(String) as unknown });
    const stillThere = await t.json<Info>('GET', `/v1/sandboxes/${c.sandboxId}`);
    expect(stillThere.body.state).toBe('killed');
    const killedList = await t.json<{ sandboxes: Info[] }>('GET', '/v1/sandboxes?state=killed');
    expect(killedList.body.sandboxes.map((s) => s.sandboxId)).toContain(c.sandboxId);
  });

  it('shortens and extends the TTL, keeps alive, and an expired sandbox keeps its record', async () => {
    const s = await create({ spec: { ttlMs: 60_000 } });
    // Each new expiry is bracketed by this clock read before and after the call (the server uses
    // the same clock): exact whatever the machine's load, where a tolerance is a guess.
    const expiry = async (path: string, body?: object): Promise<{ at: number; before: number; after: number }> => {
      const before = Date.now();
      const reply = await t.json<Info>('POST', `/v1/sandboxes/${s.sandboxId}/${path}`, body ? { body } : {});
      expect(reply.status).toBe(200);
      return { at: Date.parse(reply.body.expiresAt), before, after: Date.now() };
    };
    const extended = await expiry('timeout', { ttlMs: 120_000 });
    expect(extended.at).toBeGreaterThanOrEqual(extended.before + 120_000);
    expect(extended.at).toBeLessThanOrEqual(extended.after + 120_000);
    const kept = await expiry('keepalive');
    expect(kept.at).toBeGreaterThanOrEqual(kept.before + 60_000);
    expect(kept.at).toBeLessThanOrEqual(kept.after + 60_000);

    const shortened = await expiry('timeout', { ttlMs: 1500 });
    expect(shortened.at).toBeLessThanOrEqual(shortened.after + 1500);
    const expired = await waitFor(
      async () => {
        const r = await t.json<Info>('GET', `/v1/sandboxes/${s.sandboxId}`);
        return r.body.state === 'expired' ? r.body : undefined;
      },
      { timeoutMs: 10_000, what: 'the sandbox to expire' },
    );
    expect(expired.endReason).toMatch(/ttl/);
    // The engine reports the expiry once the sandbox's host resources are gone.
    await waitFor(
      async () => {
        const r = await t.json<{ records: { operation: string; sandboxId: string | null }[] }>('GET', '/v1/audit?limit=1000');
        return r.body.records.find((e) => e.operation === 'sandbox.expired' && e.sandboxId === s.sandboxId);
      },
      { timeoutMs: 10_000, what: 'the sandbox.expired audit event' },
    );
    const late = await t.json('POST', `/v1/sandboxes/${s.sandboxId}/keepalive`);
    expectError(late.body, 'SANDBOX_NOT_RUNNING');
  });

  it('enforces the per-tenant quota, counting sandboxes still starting', async () => {
    const results = await Promise.all([1, 2, 3, 4, 5].map(() => t.json('POST', '/v1/sandboxes', { body: {} })));
    const statuses = results.map((r) => r.status).sort();
    expect(statuses).toEqual([201, 201, 201, 201, 429]);
    const refused = results.find((r) => r.status === 429);
    expectError(refused?.body, 'QUOTA_EXCEEDED');
    expect((refused?.body as { hint?: string }).hint).toMatch(/Kill sandboxes/);

    // A refusal for quota is not stored under its Idempotency-Key: the retry after a kill runs.
    const headers = { 'idempotency-key': 'quota-retry' };
    expectError((await t.json('POST', '/v1/sandboxes', { body: {}, headers })).body, 'QUOTA_EXCEEDED');
    const victim = results.find((r) => r.status === 201)?.body as Info;
    await t.call('DELETE', `/v1/sandboxes/${victim.sandboxId}`);
    expect((await t.json('POST', '/v1/sandboxes', { body: {}, headers })).status).toBe(201);
  });

  it('hides other tenants: a foreign id is 404 SANDBOX_NOT_FOUND', async () => {
    const minted = await t.json<{ apiKey: string; tenantId: string }>('POST', '/v1/keys', { body: { tenantId: 'acme' } });
    expect(minted.status).toBe(201);
    const acmeKey = minted.body.apiKey;
    const mine = await create();
    for (const [method, path, body] of [
      ['GET', `/v1/sandboxes/${mine.sandboxId}`, undefined],
      ['DELETE', `/v1/sandboxes/${mine.sandboxId}`, undefined],
      ['POST', `/v1/sandboxes/${mine.sandboxId}/processes`, { argv: ['true'] }],
      ['GET', `/v1/sandboxes/${mine.sandboxId}/files?path=x`, undefined],
    ] as const) {
      const r = await t.json(method, path, { key: acmeKey, body });
      expect(r.status, `${method} ${path}`).toBe(404);
      expectError(r.body, 'SANDBOX_NOT_FOUND');
    }
    expect((await t.json<{ sandboxes: Info[] }>('GET', '/v1/sandboxes', { key: acmeKey })).body.sandboxes).toEqual([]);
    expectError((await t.json('POST', '/v1/keys', { key: acmeKey, body: { tenantId: 'x' } })).body, 'PERMISSION_DENIED');
    expectError((await t.json('GET', '/v1/sandboxes', { key: null })).body, 'UNAUTHENTICATED');
    expectError((await t.json('GET', '/v1/sandboxes', { key: `cap_${'0'.repeat(40)}` })).body, 'UNAUTHENTICATED');
    expect((await t.json('GET', `/v1/sandboxes/${mine.sandboxId}`, { headers: { 'x-api-key': t.apiKey }, key: null })).status).toBe(200);
  });

  it('rejects bad input with a code naming the field', async () => {
    const unknownField = await t.json<{ details: { field: string } }>('POST', '/v1/sandboxes', { body: { nope: 1 } });
    expect(unknownField.status).toBe(400);
    expectError(unknownField.body, 'INVALID_ARGUMENT');
    const badSpec = await t.json<{ details: { issues: { field: string }[] } }>('POST', '/v1/sandboxes', { body: { spec: { limits: { memoryBytes: 'x' } } } });
    expect(badSpec.status).toBe(422);
    expectError(badSpec.body, 'INVALID_SPEC');
    const malformed = await t.json('POST', '/v1/sandboxes', { raw: '{"spec":', headers: { 'content-type': 'application/json' } });
    expect(malformed.status).toBe(400);
    expectError(malformed.body, 'INVALID_ARGUMENT');
    const huge = await t.json('POST', '/v1/sandboxes', { body: { metadata: { a: 'x'.repeat(2 * 1024 * 1024) } } });
    expect(huge.status).toBe(413);
    expectError(huge.body, 'PAYLOAD_TOO_LARGE');
    expectError((await t.json('GET', '/v1/sandboxes/not-an-id')).body, 'SANDBOX_NOT_FOUND');
    expectError((await t.json('GET', '/v1/sandboxes?state=sleeping')).body, 'INVALID_ARGUMENT');
    expectError((await t.json('GET', '/v1/sandboxes?cursor=zzz')).body, 'INVALID_ARGUMENT');
    expectError((await t.json('GET', '/v1/nothing')).body, 'NOT_FOUND');
    expectError((await t.json('GET', '/%zz')).body, 'INVALID_ARGUMENT');

    // A request Node's HTTP parser refuses still gets the error shape.
    const { port, hostname } = new URL(t.url);
    const raw = await new Promise<string>((resolve, reject) => {
      const socket = connect(Number(port), hostname, () => socket.write('GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n'));
      let text = '';
      socket.on('data', (d: Buffer) => (text += d.toString()));
      socket.on('end', () => resolve(text));
      socket.on('error', reject);
    });
    expect(raw).toMatch(/^HTTP\/1\.1 400/);
    expectError(JSON.parse(raw.slice(raw.indexOf('\r\n\r\n') + 4)), 'INVALID_ARGUMENT');
  });
});

describe('processes over HTTP', () => {
  it('streams a foreground process as NDJSON ending with exit', async () => {
    const s = await create();
    const r = await t.call('POST', `/v1/sandboxes/${s.sandboxId}/processes`, { body: { argv: ['sh', '-c', 'echo out; echo err >&2; exit 3'] } });
    expect(r.status).toBe(200);
    expect(r.headers.get('content-type')).toMatch(/application\/x-ndjson/);
    const events = await readNdjson(r);
    expect(events[0]).toMatchObject({ type: 'start', pid: expect.any(Number) as unknown });
    const stdout = events.filter((e) => e.type === 'stdout').map((e) => Buffer.from(e.data as string, 'base64').toString()).join('');
    expect(stdout).toBe('out\n');
    expect(events.at(-1)).toMatchObject({ type: 'exit', result: { outcome: 'exit_nonzero', exitCode: 3, stderr: 'err\n' } });
  });

  it('ends a process past its timeout with a wall_clock limit, not a hang', async () => {
    const s = await create();
    const r = await t.call('POST', `/v1/sandboxes/${s.sandboxId}/processes`, { body: { argv: ['sleep', '30'], timeoutMs: 500 } });
    const events = await readNdjson(r);
    expect(events.at(-1)).toMatchObject({ type: 'exit', result: { outcome: 'limit_exceeded', limit: { resource: 'wall_clock' } } });
  });

  it('runs in the background, lists, reattaches by pid (also after the exit), writes and closes stdin', async () => {
    const s = await create();
    const bg = await t.json<{ pid: number }>('POST', `/v1/sandboxes/${s.sandboxId}/processes`, { body: { argv: ['cat'], stdin: true, background: true, tag: 'echo' } });
    expect(bg.status).toBe(201);
    const pid = bg.body.pid;
    const listed = await t.json<{ processes: { pid: number; running: boolean; tag?: string }[] }>('GET', `/v1/sandboxes/${s.sandboxId}/processes`);
    expect(listed.body.processes).toContainEqual(expect.objectContaining({ pid, running: true, tag: 'echo' }));

    const attached = t.call('GET', `/v1/sandboxes/${s.sandboxId}/processes/${pid}/events`);
    expect((await t.call('POST', `/v1/sandboxes/${s.sandboxId}/processes/${pid}/stdin`, { raw: 'hello ', headers: { 'content-type': 'application/octet-stream' } })).status).toBe(204);
    expect((await t.call('POST', `/v1/sandboxes/${s.sandboxId}/processes/${pid}/stdin`, { raw: Buffer.from('world') })).status).toBe(204);
    expect((await t.call('POST', `/v1/sandboxes/${s.sandboxId}/processes/${pid}/stdin/close`)).status).toBe(204);
    const events = await readNdjson(await attached);
    expect(events.at(-1)).toMatchObject({ type: 'exit', result: { outcome: 'ok', stdout: 'hello world' } });

    const late = await readNdjson(await t.call('GET', `/v1/sandboxes/${s.sandboxId}/processes/${pid}/events`));
    expect(late[0]).toMatchObject({ type: 'start', pid });
    expect(late.at(-1)).toMatchObject({ type: 'exit', result: { stdout: 'hello world' } });
    expectError((await t.json('POST', `/v1/sandboxes/${s.sandboxId}/processes/${pid}/stdin`, { raw: 'x' })).body, 'PROCESS_NOT_FOUND');
    expectError((await t.json('GET', `/v1/sandboxes/${s.sandboxId}/processes/99999/events`)).body, 'PROCESS_NOT_FOUND');
  });

  it('signals a process', async () => {
    const s = await create();
    const bg = await t.json<{ pid: number }>('POST', `/v1/sandboxes/${s.sandboxId}/processes`, { body: { argv: ['sleep', '30'], background: true } });
    const r = await t.call('POST', `/v1/sandboxes/${s.sandboxId}/processes/${bg.body.pid}/signal`, { body: { signal: 'SIGTERM' } });
    expect(r.status).toBe(204);
    const events = await readNdjson(await t.call('GET', `/v1/sandboxes/${s.sandboxId}/processes/${bg.body.pid}/events`));
    expect(events.at(-1)).toMatchObject({ type: 'exit', result: { signal: 'SIGTERM' } });
    expectError((await t.json('POST', `/v1/sandboxes/${s.sandboxId}/processes/${bg.body.pid}/signal`, { body: { signal: 'SIGNOPE' } })).body, 'INVALID_ARGUMENT');
  });

  it('says EXEC_FAILED for a program that does not exist', async () => {
    const s = await create();
    const r = await t.json('POST', `/v1/sandboxes/${s.sandboxId}/processes`, { body: { argv: ['/no/such/program'] } });
    expect(r.status).toBe(422);
    expectError(r.body, 'EXEC_FAILED');
  });
});

describe('files over HTTP', () => {
  it('round-trips 100 MiB through PUT and GET with the same sha256, streamed', async () => {
    const s = await create({ spec: { limits: { fileSizeBytes: 200 * 1024 * 1024, diskBytes: 256 * 1024 * 1024 } } });
    const chunk = randomBytes(1024 * 1024);
    const expected = createHash('sha256');
    let sent = 0;
    const upload = new ReadableStream<Uint8Array>({
      pull(controller) {
        if (sent === 100) return controller.close();
        const piece = Buffer.from(chunk);
        piece.writeUInt32BE(sent, 0);
        expected.update(piece);
        controller.enqueue(piece);
        sent++;
      },
    });
    const put = await t.json<{ size: number; path: string }>('PUT', `/v1/sandboxes/${s.sandboxId}/files?path=big.bin`, {
      raw: upload,
      headers: { 'content-type': 'application/octet-stream' },
    });
    expect(put.status, JSON.stringify(put.body)).toBe(200);
    expect(put.body).toMatchObject({ size: 100 * 1024 * 1024, path: '/workspace/big.bin' });
    const get = await t.call('GET', `/v1/sandboxes/${s.sandboxId}/files?path=/workspace/big.bin`);
    expect(get.status).toBe(200);
    const actual = createHash('sha256');
    let bytes = 0;
    for await (const part of get.body as unknown as AsyncIterable<Uint8Array>) {
      actual.update(part);
      bytes += part.length;
    }
    expect(bytes).toBe(100 * 1024 * 1024);
    expect(actual.digest('hex')).toBe(expected.digest('hex'));
  });

  it('bounds an upload by the sandbox file-size limit, leaving no partial file', async () => {
    const s = await create({ spec: { limits: { fileSizeBytes: 1024 * 1024 } } });
    const r = await t.json('PUT', `/v1/sandboxes/${s.sandboxId}/files?path=big.bin`, { raw: Buffer.alloc(3 * 1024 * 1024) });
    expect(r.status, JSON.stringify(r.body)).toBe(413);
    expectError(r.body, 'FILE_TOO_LARGE');
    expectError((await t.json('GET', `/v1/sandboxes/${s.sandboxId}/files/stat?path=big.bin`)).body, 'FILE_NOT_FOUND');
  });

  it('leaves no file behind when the client gives up mid-upload', async () => {
    const s = await create();
    const controller = new AbortController();
    let sent = 0;
    const upload = new ReadableStream<Uint8Array>({
      async pull(stream) {
        if (sent === 4) {
          controller.abort();
          return;
        }
        sent++;
        stream.enqueue(new Uint8Array(512 * 1024));
        await Promise.resolve();
      },
    });
    await expect(
      fetch(`${t.url}/v1/sandboxes/${s.sandboxId}/files?path=partial.bin`, {
        method: 'PUT',
        headers: { authorization: `Bearer ${t.apiKey}`, 'content-type': 'application/octet-stream' },
        body: upload,
        duplex: 'half',
        signal: controller.signal,
      }),
    ).rejects.toThrow();
    await waitFor(async () => {
      const r = await t.json<{ code?: string }>('GET', `/v1/sandboxes/${s.sandboxId}/files/stat?path=partial.bin`);
      return r.body.code === 'FILE_NOT_FOUND' ? true : undefined;
    }, { timeoutMs: 10_000, what: 'no partial file' });
    // The file service removes its temporary upload file too.
    await waitFor(async () => {
      const listed = await t.json<{ entries: { name: string }[] }>('GET', `/v1/sandboxes/${s.sandboxId}/files/list?path=/workspace`);
      return listed.body.entries.length === 0 ? true : undefined;
    }, { timeoutMs: 10_000, what: 'the temporary upload file to be removed' });
  });

  it('lists, stats, makes directories, moves, removes, and names missing files', async () => {
    const s = await create();
    const base = `/v1/sandboxes/${s.sandboxId}/files`;
    expect((await t.json('POST', `${base}/mkdir`, { body: { path: 'd/e' } })).status).toBe(201);
    expect((await t.call('PUT', `${base}?path=d/a.txt`, { raw: 'hi' })).status).toBe(200);
    const listed = await t.json<{ entries: { name: string }[] }>('GET', `${base}/list?path=d`);
    expect(listed.body.entries.map((e) => e.name).sort()).toEqual(['a.txt', 'e']);
    expect((await t.json('GET', `${base}/stat?path=d/a.txt`)).body).toMatchObject({ type: 'file', size: 2 });
    expect((await t.json('POST', `${base}/move`, { body: { source: 'd/a.txt', destination: 'd/b.txt' } })).body).toMatchObject({ name: 'b.txt' });
    expect(await (await t.call('GET', `${base}?path=d/b.txt`)).text()).toBe('hi');
    expect((await t.call('DELETE', `${base}?path=d/b.txt`)).status).toBe(204);
    const missing = await t.json('GET', `${base}/stat?path=d/b.txt`);
    expect(missing.status).toBe(404);
    expectError(missing.body, 'FILE_NOT_FOUND');
    expectError((await t.json('GET', `${base}?`)).body, 'INVALID_PATH');
    expectError((await t.json('POST', `${base}/mkdir`, { body: { path: 'a\u0000b' } })).body, 'INVALID_PATH');
  });
});

describe('file watch over HTTP', () => {
  it('streams events as NDJSON and stops the watcher when the client goes away', async () => {
    const s = await create();
    const base = `/v1/sandboxes/${s.sandboxId}/files`;
    const watch = await t.call('GET', `${base}/watch?path=/workspace&recursive=true`);
    expect(watch.status).toBe(200);
    expect(watch.headers.get('content-type')).toMatch(/application\/x-ndjson/);
    const reader = watch.body!.getReader();
    expect((await t.call('PUT', `${base}?path=w1.txt`, { raw: 'x' })).status).toBe(200);
    let text = '';
    while (!text.includes('w1.txt')) {
      const { value, done } = (await reader.read()) as { value?: Uint8Array; done: boolean };
      if (done) break;
      text += new TextDecoder().decode(value);
    }
    const first = JSON.parse(text.split('\n')[0]!) as { type: string; path: string };
    expect(first.path).toBe('/workspace/w1.txt');
    await reader.cancel();
    const { body } = await t.json<{ records: { operation: string; phase: string; outcome: string | null; sandboxId: string | null }[] }>('GET', '/v1/audit?limit=1000');
    const watchRecords = body.records.filter((r) => r.operation === 'files.watch' && r.sandboxId === s.sandboxId);
    expect(watchRecords.map((r) => [r.phase, r.outcome])).toEqual([
      ['attempt', null],
      ['outcome', 'ok'],
    ]);
    // afterEach: killing the sandbox and the leak check show the watcher did not outlive it.
  });
});

describe('idempotency over HTTP', () => {
  it('creates one sandbox for two calls with one key, and refuses the key for another body', async () => {
    const headers = { 'idempotency-key': 'create-once-1' };
    const first = await t.json<Info>('POST', '/v1/sandboxes', { body: { metadata: { idem: 'yes' } }, headers });
    const second = await t.json<Info>('POST', '/v1/sandboxes', { body: { metadata: { idem: 'yes' } }, headers });
    expect(first.status).toBe(201);
    expect(second.status).toBe(201);
    expect(second.body.sandboxId).toBe(first.body.sandboxId);
    expect(second.headers.get('idempotent-replayed')).toBe('true');
    expect(first.headers.get('idempotent-replayed')).toBeNull();
    const listed = await t.json<{ sandboxes: Info[] }>('GET', '/v1/sandboxes?metadata=idem=yes');
    expect(listed.body.sandboxes).toHaveLength(1);
    const reused = await t.json('POST', '/v1/sandboxes', { body: { metadata: { idem: 'no' } }, headers });
    expect(reused.status).toBe(409);
    expectError(reused.body, 'IDEMPOTENCY_KEY_REUSED');

    const op = await t.json<{ status: string; response: { status: number; body: Info } }>('GET', '/v1/operations/create-once-1');
    expect(op.body).toMatchObject({ key: 'create-once-1', status: 'completed', response: { status: 201, body: { sandboxId: first.body.sandboxId } } });
    expectError((await t.json('GET', '/v1/operations/never-used')).body, 'NOT_FOUND');
  });

  it('never stores a minted key: a replay of POST /v1/keys says it was shown once', async () => {
    const headers = { 'idempotency-key': 'mint-1' };
    const first = await t.json<{ apiKey: string | null }>('POST', '/v1/keys', { body: { tenantId: 'beta' }, headers });
    const replay = await t.json<{ apiKey: string | null; keyId: string }>('POST', '/v1/keys', { body: { tenantId: 'beta' }, headers });
    expect(first.body.apiKey).toMatch(/^cap_/);
    expect(replay.body).toMatchObject({ apiKey: null, note: expect.stringMatching(/shown only once/) as unknown });
    const stored = JSON.stringify(t.server.db.prepare('SELECT * FROM operations').all());
    expect(stored).not.toContain(first.body.apiKey!);
  });

  it('stores a foreground exec as its exit event, and says CONFLICT while it runs', async () => {
    const s = await create();
    const headers = { 'idempotency-key': 'exec-1' };
    const body = { argv: ['sh', '-c', 'read x; echo got $x'], stdin: true };
    const running = await t.call('POST', `/v1/sandboxes/${s.sandboxId}/processes`, { body, headers });
    const reader = running.body!.getReader();
    const firstChunk = new TextDecoder().decode((await reader.read()).value as Uint8Array);
    const pid = (JSON.parse(firstChunk.split('\n')[0]!) as { pid: number }).pid;
    const duplicate = await t.json<{ hint: string }>('POST', `/v1/sandboxes/${s.sandboxId}/processes`, { body, headers });
    expect(duplicate.status).toBe(409);
    expectError(duplicate.body, 'CONFLICT');
    expect(duplicate.body.hint).toMatch(/GET \/v1\/operations\/exec-1/);
    expect((await t.json('GET', '/v1/operations/exec-1')).body).toMatchObject({ status: 'in_progress' });

    // The client goes away; the process keeps running and can be reattached.
    await reader.cancel();
    await t.call('POST', `/v1/sandboxes/${s.sandboxId}/processes/${pid}/stdin`, { raw: 'ping\n' });
    const exit = (await readNdjson(await t.call('GET', `/v1/sandboxes/${s.sandboxId}/processes/${pid}/events`))).at(-1);
    expect(exit).toMatchObject({ type: 'exit', result: { stdout: 'got ping\n' } });
    const op = await waitFor(async () => {
      const r = await t.json<{ status: string }>('GET', '/v1/operations/exec-1');
      return r.body.status === 'completed' ? r.body : undefined;
    });
    expect(op).toMatchObject({ response: { status: 200, body: { type: 'exit', result: { stdout: 'got ping\n' } } } });
    const replay = await t.call('POST', `/v1/sandboxes/${s.sandboxId}/processes`, { body, headers });
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect(await readNdjson(replay)).toEqual([exit]);
  });
});

describe('audit over HTTP', () => {
  it('records attempts and outcomes with hashed subjects and opened policy', async () => {
    const s = await create({ spec: { limits: { memoryBytes: 1024 * 2 ** 20 } } });
    await readNdjson(await t.call('POST', `/v1/sandboxes/${s.sandboxId}/processes`, { body: { argv: ['sleep', '5'], timeoutMs: 200 } }));
    const { body } = await t.json<{ records: { seq: number; operation: string; phase: string; policy: string | null; sandboxId: string | null; subjectSha256: string | null; outcome: string | null; attemptSeq: number | null }[] }>(
      'GET',
      '/v1/audit?limit=1000',
    );
    const mine = body.records.filter((r) => r.sandboxId === s.sandboxId || (r.operation === 'sandboxes.create' && r.phase === 'attempt'));
    const createAttempt = mine.filter((r) => r.operation === 'sandboxes.create' && r.phase === 'attempt').at(-1);
    expect(JSON.parse(createAttempt?.policy ?? 'null')).toEqual({ limits: { memoryBytes: 1024 * 2 ** 20 } });
    const execOutcome = body.records.find((r) => r.operation === 'processes.start' && r.phase === 'outcome' && r.sandboxId === s.sandboxId);
    expect(execOutcome?.outcome).toBe('limit:wall_clock');
    const execAttempt = body.records.find((r) => r.seq === execOutcome?.attemptSeq);
    expect(execAttempt?.subjectSha256).toBe(createHash('sha256').update(JSON.stringify(['sleep', '5'])).digest('hex'));
    expect(JSON.stringify(body.records)).not.toContain('sleep');
  });

  it('fails the call with 500 and does not act when the audit log cannot be written', async () => {
    t.server.db.exec("CREATE TEMP TRIGGER audit_down BEFORE INSERT ON audit BEGIN SELECT RAISE(ABORT, 'disk on fire'); END");
    const headers = { 'idempotency-key': 'attempt-down' };
    try {
      const r = await t.json('POST', '/v1/sandboxes', { body: { metadata: { audit: 'down' } }, headers });
      expect(r.status).toBe(500);
      expectError(r.body, 'INTERNAL');
      expect(JSON.stringify(r.body)).not.toContain('disk on fire');
    } finally {
      t.server.db.exec('DROP TRIGGER audit_down');
    }
    expect((await t.json<{ sandboxes: Info[] }>('GET', '/v1/sandboxes?metadata=audit=down')).body.sandboxes).toEqual([]);
    // The key's claim rolled back with the attempt: a retry with the same key runs the call.
    const retry = await t.json<Info>('POST', '/v1/sandboxes', { body: { metadata: { audit: 'down' } }, headers });
    expect(retry.status).toBe(201);
    expect(retry.headers.get('idempotent-replayed')).toBeNull();
    await t.call('DELETE', `/v1/sandboxes/${retry.body.sandboxId}`);
  });

  it('reports an unknown effect when the outcome cannot be written, and a retry does not act twice', async () => {
    t.server.db.exec("CREATE TEMP TRIGGER audit_outcome_down BEFORE INSERT ON audit WHEN NEW.phase = 'outcome' BEGIN SELECT RAISE(ABORT, 'disk on fire'); END");
    const headers = { 'idempotency-key': 'outcome-down' };
    let first: { status: number; body: unknown };
    try {
      first = await t.json('POST', '/v1/sandboxes', { body: { metadata: { outcome: 'down' } }, headers });
    } finally {
      t.server.db.exec('DROP TRIGGER audit_outcome_down');
    }
    expect(first.status).toBe(500);
    expect(first.body).toMatchObject({ code: 'INTERNAL', details: { effect: 'unknown' } });
    const retry = await t.json('POST', '/v1/sandboxes', { body: { metadata: { outcome: 'down' } }, headers });
    expect(retry.status).toBe(500);
    expect(retry.headers.get('idempotent-replayed')).toBe('true');
    // The create did happen (the audit has its attempt); the retry did not make a second one.
    expect((await t.json<{ sandboxes: Info[] }>('GET', '/v1/sandboxes?metadata=outcome=down')).body.sandboxes).toHaveLength(1);
  });

  it('keeps an unknown effect under the key when the response cannot be stored, and a retry does not act twice', async () => {
    // Storing the 201 fails; the audit outcome rolls back with it; storing the error works.
    t.server.db.exec("CREATE TEMP TRIGGER store_down BEFORE UPDATE ON operations WHEN NEW.response_status = 201 BEGIN SELECT RAISE(ABORT, 'disk on fire'); END");
    const headers = { 'idempotency-key': 'store-down' };
    let first: { status: number; body: unknown };
    try {
      first = await t.json('POST', '/v1/sandboxes', { body: { metadata: { store: 'down' } }, headers });
    } finally {
      t.server.db.exec('DROP TRIGGER store_down');
    }
    expect(first.status).toBe(500);
    expect(first.body).toMatchObject({ code: 'INTERNAL', details: { effect: 'unknown' } });
    const retry = await t.json('POST', '/v1/sandboxes', { body: { metadata: { store: 'down' } }, headers });
    expect(retry.status).toBe(500);
    expect(retry.headers.get('idempotent-replayed')).toBe('true');
    expect((await t.json<{ sandboxes: Info[] }>('GET', '/v1/sandboxes?metadata=store=down')).body.sandboxes).toHaveLength(1);
  });
});

describe('logs', () => {
  it('are JSON lines with request ids, and never hold an API key or an uploaded body', async () => {
    const s = await create();
    const secret = `upload-${randomBytes(8).toString('hex')}`;
    expect((await t.call('PUT', `/v1/sandboxes/${s.sandboxId}/files?path=secret.txt`, { raw: secret })).status).toBe(200);
    await t.json('GET', '/v1/sandboxes', { headers: { 'x-api-key': t.apiKey }, key: null });
    await t.json('POST', '/v1/sandboxes', { raw: '{"broken', headers: { 'content-type': 'application/json' } });
    const lines = logs.split('\n').filter((l) => l !== '');
    expect(lines.length).toBeGreaterThan(10);
    for (const line of lines) expect(() => JSON.parse(line) as unknown, line).not.toThrow();
    expect(lines.some((l) => /"reqId":"req_/.test(l))).toBe(true);
    expect(logs).not.toContain(t.apiKey);
    expect(logs).not.toContain(t.apiKey.slice(4));
    expect(logs).not.toContain(secret);
  });
});

describe('service documents', () => {
  it('serves /healthz and an OpenAPI document with every route', async () => {
    expect((await t.json('GET', '/healthz', { key: null })).body).toEqual({ ok: true });
    const doc = await t.json<{ openapi: string; paths: Record<string, Record<string, unknown>> }>('GET', '/openapi.json', { key: null });
    expect(doc.body.openapi).toBe('3.1.0');
    const routes = Object.entries(doc.body.paths).flatMap(([path, methods]) => Object.keys(methods).map((m) => `${m.toUpperCase()} ${path}`));
    for (const route of [
      'POST /v1/sandboxes',
      'GET /v1/sandboxes',
      'GET /v1/sandboxes/{sandboxId}',
      'DELETE /v1/sandboxes/{sandboxId}',
      'POST /v1/sandboxes/{sandboxId}/timeout',
      'POST /v1/sandboxes/{sandboxId}/keepalive',
      'POST /v1/sandboxes/{sandboxId}/processes',
      'GET /v1/sandboxes/{sandboxId}/processes',
      'GET /v1/sandboxes/{sandboxId}/processes/{pid}/events',
      'POST /v1/sandboxes/{sandboxId}/processes/{pid}/stdin',
      'POST /v1/sandboxes/{sandboxId}/processes/{pid}/stdin/close',
      'POST /v1/sandboxes/{sandboxId}/processes/{pid}/signal',
      'GET /v1/sandboxes/{sandboxId}/files',
      'PUT /v1/sandboxes/{sandboxId}/files',
      'DELETE /v1/sandboxes/{sandboxId}/files',
      'GET /v1/sandboxes/{sandboxId}/files/list',
      'GET /v1/sandboxes/{sandboxId}/files/stat',
      'POST /v1/sandboxes/{sandboxId}/files/mkdir',
      'POST /v1/sandboxes/{sandboxId}/files/move',
      'GET /v1/sandboxes/{sandboxId}/files/watch',
      'POST /v1/keys',
      'GET /v1/audit',
      'GET /v1/operations/{key}',
      'GET /healthz',
      'GET /openapi.json',
    ]) {
      expect(routes).toContain(route);
    }
  });
});
