import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Readable } from 'node:stream';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import {
  AbortedError,
  CapsuleError,
  ConnectionError,
  FileNotFoundError,
  Sandbox,
  SandboxNotFoundError,
  TimeoutError,
  type WatchEvent,
} from '../../src/sdk/index.js';
import type { Transport, TransportRequest } from '../../src/sdk/http.js';

/**
 * Wire-format tests against a scripted HTTP server on loopback: what the SDK sends, how it reads
 * streams, retries and errors. The real server is exercised in test/e2e/sdk-*.test.ts.
 */
interface Seen {
  method: string;
  url: URL;
  headers: IncomingMessage['headers'];
  body: Buffer;
}
type Handler = (req: Seen, res: ServerResponse) => void;

let server: Server;
let url = '';
const seen: Seen[] = [];
let handlers: Handler[] = [];
/** Connections the server accepted, to see which calls shared one. */
let connectionsOpened = 0;

/** Answers the next requests, in order, with these handlers. */
function script(...next: Handler[]): void {
  handlers.push(...next);
}

function json(status: number, body: unknown): Handler {
  return (_req, res) => {
    res.writeHead(status, { 'content-type': 'application/json' });
    res.end(JSON.stringify(body));
  };
}

const INFO = { sandboxId: 'abcdefghijklmnopqrst', tenantId: 't', state: 'running', backend: 'namespace', spec: {}, metadata: {}, createdAt: '', expiresAt: '' };
const RESULT = {
  outcome: 'ok', exitCode: 0, signal: null, stdout: 'hé\n', stderr: '', stdoutTruncated: false, stderrTruncated: false,
  stdoutBytes: 4, stderrBytes: 0, durationMs: 3, usage: { memoryPeakBytes: 0, cpuTimeMs: 0, cpuThrottledMs: 0, diskUsedBytes: null }, warnings: [],
};
const b64 = (data: string | Buffer) => Buffer.from(data).toString('base64');

beforeAll(async () => {
  server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => {
      const entry = { method: req.method ?? '', url: new URL(req.url ?? '/', 'http://x'), headers: req.headers, body: Buffer.concat(chunks) };
      seen.push(entry);
      const handler = handlers.shift();
      if (handler) handler(entry, res);
      else json(500, { code: 'INTERNAL', message: `unscripted ${req.method} ${req.url}`, requestId: 'r' })(entry, res);
    });
  });
  server.on('connection', () => connectionsOpened++);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(async () => {
  server.closeAllConnections();
  await new Promise((resolve) => server.close(resolve));
});
afterEach(() => {
  expect(handlers, 'every scripted reply was used').toEqual([]);
  handlers = [];
  seen.length = 0;
});

async function sandbox(): Promise<Sandbox> {
  script(json(201, INFO));
  const sb = await Sandbox.create(undefined, { url, apiKey: 'k1' });
  seen.length = 0;
  return sb;
}

function thrown(promise: Promise<unknown>): Promise<unknown> {
  return promise.then(
    () => {
      throw new Error('expected a rejection');
    },
    (error: unknown) => error,
  );
}

describe('SDK requests', () => {
  it('creates a sandbox with the spec, metadata, bearer key and an idempotency key', async () => {
    script(json(201, INFO));
    const sb = await Sandbox.create({ limits: { memoryBytes: 64 * 2 ** 20 } }, { url, apiKey: 'k1', metadata: { job: '7' } });
    expect(sb.sandboxId).toBe(INFO.sandboxId);
    const [req] = seen;
    expect(req?.method).toBe('POST');
    expect(req?.url.pathname).toBe('/v1/sandboxes');
    expect(req?.headers.authorization).toBe('Bearer k1');
    expect(req?.headers['idempotency-key']).toMatch(/^[0-9a-f-]{36}$/);
    expect(JSON.parse(req?.body.toString() ?? '')).toEqual({ spec: { limits: { memoryBytes: 64 * 2 ** 20 } }, metadata: { job: '7' } });
  });

  it('lists with repeated metadata filters and follows cursors in listAll', async () => {
    script(json(200, { sandboxes: [INFO], nextCursor: 'c2' }), json(200, { sandboxes: [{ ...INFO, sandboxId: 'b' }], nextCursor: null }));
    const ids: string[] = [];
    for await (const info of Sandbox.listAll({ url, state: ['running', 'paused'], metadata: { a: '1', b: '2' }, limit: 1 })) ids.push(info.sandboxId);
    expect(ids).toEqual([INFO.sandboxId, 'b']);
    expect(seen[0]?.url.searchParams.get('state')).toBe('running,paused');
    expect(seen[0]?.url.searchParams.getAll('metadata')).toEqual(['a=1', 'b=2']);
    expect(seen[0]?.url.searchParams.get('limit')).toBe('1');
    expect(seen[1]?.url.searchParams.get('cursor')).toBe('c2');
    expect(seen[0]?.headers['idempotency-key']).toBeUndefined();
  });

  it('sends setTimeout, keepAlive and kill to their routes', async () => {
    const sb = await sandbox();
    script(json(200, INFO), json(200, INFO), json(200, { ...INFO, state: 'killed' }));
    await sb.setTimeout(1234);
    await sb.keepAlive();
    expect((await sb.kill()).state).toBe('killed');
    expect(sb.info.state).toBe('killed');
    expect(seen.map((r) => `${r.method} ${r.url.pathname}`)).toEqual([
      `POST /v1/sandboxes/${INFO.sandboxId}/timeout`,
      `POST /v1/sandboxes/${INFO.sandboxId}/keepalive`,
      `DELETE /v1/sandboxes/${INFO.sandboxId}`,
    ]);
    expect(JSON.parse(seen[0]?.body.toString() ?? '')).toEqual({ ttlMs: 1234 });
  });
});

describe('SDK errors and retries', () => {
  it('turns the wire code into a typed error with status, hint, details and request id', async () => {
    script(json(404, { code: 'SANDBOX_NOT_FOUND', message: 'no sandbox x', hint: 'list them', details: { sandboxId: 'x' }, requestId: 'req-1' }));
    const error = await thrown(Sandbox.connect('x', { url }));
    expect(error).toBeInstanceOf(SandboxNotFoundError);
    expect(error).toMatchObject({ code: 'SANDBOX_NOT_FOUND', status: 404, hint: 'list them', requestId: 'req-1', details: { sandboxId: 'x' } });
  });

  it('retries once with the same idempotency key on 503, then succeeds', async () => {
    script(json(503, { code: 'BACKEND_UNAVAILABLE', message: 'busy', requestId: 'r' }), json(201, INFO));
    await Sandbox.create(undefined, { url });
    expect(seen).toHaveLength(2);
    expect(seen[0]?.headers['idempotency-key']).toBe(seen[1]?.headers['idempotency-key']);
  });

  it('retries once when the connection breaks, and gives up after the second failure', async () => {
    const drop: Handler = (_req, res) => res.socket?.destroy();
    script(drop, json(201, INFO));
    await Sandbox.create(undefined, { url });
    expect(seen[0]?.headers['idempotency-key']).toBe(seen[1]?.headers['idempotency-key']);
    script(drop, drop);
    const error = await thrown(Sandbox.create(undefined, { url }));
    expect(error).toBeInstanceOf(ConnectionError);
    expect((error as CapsuleError).code).toBe('SERVER_UNREACHABLE');
  });

  it('does not retry a 500 or a 409', async () => {
    script(json(500, { code: 'INTERNAL', message: 'boom', requestId: 'r' }));
    expect(await thrown(Sandbox.create(undefined, { url }))).toMatchObject({ code: 'INTERNAL', status: 500 });
    script(json(409, { code: 'IDEMPOTENCY_KEY_REUSED', message: 'x', requestId: 'r' }));
    expect(await thrown(Sandbox.create(undefined, { url }))).toMatchObject({ code: 'IDEMPOTENCY_KEY_REUSED' });
    expect(seen).toHaveLength(2);
  });

  it('keeps an unknown code and reads a body that is not JSON', async () => {
    script(json(418, { code: 'TEAPOT', message: 'short and stout', requestId: 'r' }));
    const unknown = await thrown(Sandbox.connect('x', { url }));
    expect(unknown).toBeInstanceOf(CapsuleError);
    expect(unknown).toMatchObject({ code: 'TEAPOT', status: 418 });
    script((_req, res) => res.writeHead(404, { 'content-type': 'text/html' }).end('<h1>nope</h1>'));
    expect(await thrown(Sandbox.connect('x', { url }))).toMatchObject({ code: 'NOT_FOUND', status: 404 });
  });

  it('says the server is unreachable when nothing listens', async () => {
    const closed = createServer();
    await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve));
    const { port } = closed.address() as AddressInfo;
    await new Promise((resolve) => closed.close(resolve));
    const error = await thrown(Sandbox.list({ url: `http://127.0.0.1:${port}` }));
    expect(error).toBeInstanceOf(ConnectionError);
    expect((error as CapsuleError).message).toBe(`GET /v1/sandboxes: cannot reach the Capsule server at http://127.0.0.1:${port} (ECONNREFUSED)`);
  });

  it('ends a call at timeoutMs with TimeoutError, and at abort with AbortedError', async () => {
    const hang: Handler = () => undefined;
    script(hang);
    // The server never answers: only the SDK's own deadline can end the call, so the error's
    // class is the proof (an elapsed-time bound would only measure how busy the machine is).
    expect(await thrown(Sandbox.list({ url, timeoutMs: 200 }))).toBeInstanceOf(TimeoutError);
    const controller = new AbortController();
    script(() => controller.abort());
    const pending = thrown(Sandbox.list({ url, signal: controller.signal }));
    expect(await pending).toBeInstanceOf(AbortedError);
  });
});

describe('SDK streams', () => {
  it('runs a command: NDJSON split anywhere, UTF-8 split across events, stdin sent then closed', async () => {
    const sb = await sandbox();
    const bytes = Buffer.from('hé\n');
    script(
      (_req, res) => {
        res.writeHead(200, { 'content-type': 'application/x-ndjson' });
        const lines = [
          { type: 'start', pid: 7 },
          { type: 'stdout', data: b64(bytes.subarray(0, 2)) },
          { type: 'stdout', data: b64(bytes.subarray(2)) },
          { type: 'stderr', data: b64('warn') },
        ]
          .map((l) => JSON.stringify(l) + '\n')
          .join('');
        // Split mid-line; the rest (and the exit) follows once stdin was closed.
        res.write(lines.slice(0, 17));
        res.write(lines.slice(17));
        handlers.push(json(204, undefined), (_req2, res2) => {
          res2.writeHead(204).end();
          res.end(JSON.stringify({ type: 'exit', result: RESULT }) + '\n');
        });
      },
    );
    let stdout = '';
    let stderr = '';
    const result = await sb.commands.run(['cat'], { stdin: 'input', onStdout: (d) => (stdout += d), onStderr: (d) => (stderr += d), cwd: '/tmp' });
    expect(result.stdout).toBe('hé\n');
    expect(stdout).toBe('hé\n');
    expect(stderr).toBe('warn');
    const [start, write, close] = seen;
    expect(JSON.parse(start?.body.toString() ?? '')).toEqual({ argv: ['cat'], cwd: '/tmp', stdin: true, background: false });
    expect(write?.url.pathname).toBe(`/v1/sandboxes/${INFO.sandboxId}/processes/7/stdin`);
    expect(write?.body.toString()).toBe('input');
    expect(write?.headers['content-type']).toBe('application/octet-stream');
    expect(close?.url.pathname).toBe(`/v1/sandboxes/${INFO.sandboxId}/processes/7/stdin/close`);
  });

  it('runs a string through sh -c and turns a mid-stream error event into a typed error', async () => {
    const sb = await sandbox();
    script((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/x-ndjson' });
      res.end(`${JSON.stringify({ type: 'start', pid: 3 })}\n${JSON.stringify({ type: 'error', error: { code: 'SANDBOX_CRASHED', message: 'gone', requestId: 'r9' } })}\n`);
    });
    const error = await thrown(sb.commands.run('echo hi'));
    expect(error).toMatchObject({ code: 'SANDBOX_CRASHED', status: 502, requestId: 'r9' });
    expect((JSON.parse(seen[0]?.body.toString() ?? '') as { argv: string[] }).argv).toEqual(['sh', '-c', 'echo hi']);
  });

  it('kills the process when a foreground run is aborted, and rejects once its exit was seen', async () => {
    const sb = await sandbox();
    const controller = new AbortController();
    let exitSent = false;
    script(
      (_req, res) => {
        res.writeHead(200, { 'content-type': 'application/x-ndjson' });
        res.write(`${JSON.stringify({ type: 'start', pid: 9 })}\n`);
        res.write(`${JSON.stringify({ type: 'stdout', data: b64('x') })}\n`);
      },
      json(204, undefined),
      (_req, res) => {
        res.writeHead(200, { 'content-type': 'application/x-ndjson' });
        res.write(`${JSON.stringify({ type: 'start', pid: 9 })}\n`);
        setImmediate(() => {
          exitSent = true;
          res.end(`${JSON.stringify({ type: 'exit', result: { ...RESULT, outcome: 'exit_nonzero', exitCode: null, signal: 'SIGKILL' } })}\n`);
        });
      },
    );
    const pending = thrown(sb.commands.run(['sleep', '60'], { signal: controller.signal, onStdout: () => controller.abort() }));
    expect(await pending).toBeInstanceOf(AbortedError);
    expect(exitSent).toBe(true);
    expect(seen[1]?.url.pathname).toBe(`/v1/sandboxes/${INFO.sandboxId}/processes/9/signal`);
    expect(JSON.parse(seen[1]?.body.toString() ?? '')).toEqual({ signal: 'SIGKILL' });
    expect(seen[2]?.url.pathname).toBe(`/v1/sandboxes/${INFO.sandboxId}/processes/9/events`);
  });

  it('reattaches when the stream breaks mid-run, delivering each byte and warning once', async () => {
    const sb = await sandbox();
    const warning = { resource: 'memory', limit: 100, used: 90, message: 'near' };
    const line = (e: object) => `${JSON.stringify(e)}\n`;
    script(
      (_req, res) => {
        res.writeHead(200, { 'content-type': 'application/x-ndjson' });
        res.write(line({ type: 'start', pid: 4 }) + line({ type: 'stdout', data: b64('ab') }) + line({ type: 'warning', warning }));
        res.write(line({ type: 'stdout', data: b64('c') }), () => res.socket?.destroy());
      },
      (_req, res) => {
        res.writeHead(200, { 'content-type': 'application/x-ndjson' });
        const replay = [
          { type: 'start', pid: 4 },
          { type: 'stdout', data: b64('a') },
          { type: 'stdout', data: b64('bcd') },
          { type: 'warning', warning },
          { type: 'stdout', data: b64('e') },
          { type: 'exit', result: RESULT },
        ];
        res.end(replay.map(line).join(''));
      },
    );
    let out = '';
    const warnings: unknown[] = [];
    const result = await sb.commands.run(['x'], { onStdout: (d) => (out += d), onWarning: (w) => warnings.push(w) });
    expect(result.outcome).toBe('ok');
    expect(out).toBe('abcde');
    expect(warnings).toHaveLength(1);
    expect(seen[1]?.url.pathname).toBe(`/v1/sandboxes/${INFO.sandboxId}/processes/4/events`);
  });

  it('puts back the whole kept output when the result carries only its first MiB inline, across a reattach', async () => {
    const sb = await sandbox();
    const line = (l: object) => `${JSON.stringify(l)}\n`;
    const part = (c: string) => Buffer.alloc(700 * 1024, c);
    const inline = Buffer.concat([part('a'), part('b')]).subarray(0, 1024 * 1024).toString();
    const result = { ...RESULT, stdout: inline, stdoutBytes: 3 * 700 * 1024, stdoutInlineTruncated: true, stderr: 'e', stderrBytes: 1 };
    script(
      (_req, res) => {
        res.writeHead(200, { 'content-type': 'application/x-ndjson' });
        res.write(line({ type: 'start', pid: 8 }) + line({ type: 'stdout', data: b64(part('a')) }), () => res.socket?.destroy());
      },
      (_req, res) => {
        res.writeHead(200, { 'content-type': 'application/x-ndjson' });
        const replay = [
          { type: 'start', pid: 8 },
          { type: 'stdout', data: b64(part('a')) },
          { type: 'stdout', data: b64(part('b')) },
          { type: 'stderr', data: b64('e') },
          { type: 'stdout', data: b64(part('c')) },
          { type: 'exit', result },
        ];
        res.end(replay.map(line).join(''));
      },
    );
    const got = await sb.commands.run(['x']);
    expect(got.stdout).toBe(Buffer.concat([part('a'), part('b'), part('c')]).toString());
    expect(got.stderr).toBe('e');
    expect(got.stdoutInlineTruncated).toBeUndefined();
    expect(got.stdoutBytes).toBe(3 * 700 * 1024);
  });

  it('starts a background process, reattaches to its events and kills it', async () => {
    const sb = await sandbox();
    const events = [{ type: 'start', pid: 5 }, { type: 'stdout', data: b64('tick\n') }, { type: 'exit', result: { ...RESULT, outcome: 'exit_nonzero', exitCode: null, signal: 'SIGKILL' } }];
    script(json(201, { pid: 5 }), json(204, undefined), (_req, res) => {
      res.writeHead(200, { 'content-type': 'application/x-ndjson' });
      res.end(events.map((e) => JSON.stringify(e)).join('\n'));
    });
    const handle = await sb.commands.run(['sleep', '60'], { background: true });
    expect(handle.pid).toBe(5);
    await handle.kill();
    let out = '';
    const again = await sb.commands.connect(5, { onStdout: (d) => (out += d) });
    expect((await again.wait()).signal).toBe('SIGKILL');
    expect(out).toBe('tick\n');
    expect(seen.map((r) => `${r.method} ${r.url.pathname}`)).toEqual([
      `POST /v1/sandboxes/${INFO.sandboxId}/processes`,
      `POST /v1/sandboxes/${INFO.sandboxId}/processes/5/signal`,
      `GET /v1/sandboxes/${INFO.sandboxId}/processes/5/events`,
    ]);
  });
});

describe('SDK files', () => {
  it('reads text, bytes and streams, and writes strings and streams', async () => {
    const sb = await sandbox();
    const body = (data: string): Handler => (_req, res) => res.writeHead(200, { 'content-type': 'application/octet-stream' }).end(data);
    const entry = { name: 'a', path: '/workspace/a', type: 'file', size: 3, mode: 0o644, modifiedAt: '' };
    script(body('héllo'), body('\x01\x02'), body('streamed'), json(200, entry), json(200, entry));
    expect(await sb.files.read('a')).toBe('héllo');
    expect([...(await sb.files.read('a', { format: 'bytes' }))]).toEqual([1, 2]);
    expect(await new Response(await sb.files.read('a', { format: 'stream' })).text()).toBe('streamed');
    expect(await sb.files.write('a', 'abc')).toEqual(entry);
    async function* parts() {
      yield await Promise.resolve(new TextEncoder().encode('one '));
      yield new TextEncoder().encode('two');
    }
    await sb.files.write('dir/b', parts());
    expect(seen[0]?.url.searchParams.get('path')).toBe('a');
    expect(seen[3]?.method).toBe('PUT');
    expect(seen[3]?.body.toString()).toBe('abc');
    expect(seen[4]?.body.toString()).toBe('one two');
  });

  it('lists with depth, answers exists from FILE_NOT_FOUND, and moves, makes and removes', async () => {
    const sb = await sandbox();
    script(
      json(200, { entries: [] }),
      json(404, { code: 'FILE_NOT_FOUND', message: 'no such file', requestId: 'r' }),
      json(404, { code: 'FILE_NOT_FOUND', message: 'no such file', requestId: 'r' }),
      json(201, {}),
      json(200, {}),
      json(204, undefined),
    );
    expect(await sb.files.list('/workspace', { depth: 2 })).toEqual([]);
    expect(await sb.files.exists('missing')).toBe(false);
    expect(await thrown(sb.files.stat('missing'))).toBeInstanceOf(FileNotFoundError);
    await sb.files.makeDir('d');
    await sb.files.move('a', 'b');
    await sb.files.remove('b');
    expect(seen[0]?.url.searchParams.get('depth')).toBe('2');
    expect(seen.slice(3).map((r) => `${r.method} ${r.url.pathname} ${r.body.toString()}`)).toEqual([
      `POST /v1/sandboxes/${INFO.sandboxId}/files/mkdir {"path":"d"}`,
      `POST /v1/sandboxes/${INFO.sandboxId}/files/move {"source":"a","destination":"b"}`,
      `DELETE /v1/sandboxes/${INFO.sandboxId}/files `,
    ]);
  });

  it('watches until stopped, ignoring lines that are not changes', async () => {
    const sb = await sandbox();
    let reply: ServerResponse | undefined;
    script((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/x-ndjson' });
      res.write(`${JSON.stringify({ type: 'heartbeat' })}\n${JSON.stringify({ type: 'create', path: '/workspace/x' })}\n`);
      reply = res;
    });
    const events: WatchEvent[] = [];
    let resolveFirst: () => void = () => undefined;
    const first = new Promise<void>((resolve) => (resolveFirst = resolve));
    const watch = await sb.files.watch('/workspace', {
      recursive: true,
      onEvent: (e) => {
        events.push(e);
        resolveFirst();
      },
    });
    await first;
    watch.stop();
    await watch.done;
    reply?.end();
    expect(events).toEqual([{ type: 'create', path: '/workspace/x' }]);
    expect(seen[0]?.url.searchParams.get('recursive')).toBe('true');
  });
});

/** Resolves when the server side of a reply closed (its connection ended or was reused). */
function closed(res: ServerResponse | undefined): Promise<void> {
  return new Promise((resolve) => (res === undefined || res.closed ? resolve() : res.once('close', () => resolve())));
}

describe('SDK transport', () => {
  it('keeps its connections for the next calls, also after streams whose end comes late', async () => {
    const sb = await sandbox();
    // A run's reply sends its exit line but ends only when the next request arrived.
    let held: ServerResponse | undefined;
    const exitHeld: Handler = (_req, res) => {
      res.writeHead(200, { 'content-type': 'application/x-ndjson' });
      res.write(`${JSON.stringify({ type: 'start', pid: 2 })}\n${JSON.stringify({ type: 'exit', result: RESULT })}\n`);
      held = res;
    };
    const listThenEnd: Handler = (req, res) => {
      held?.end();
      json(200, { processes: [] })(req, res);
    };
    const before = connectionsOpened;
    for (let round = 0; round < 4; round++) {
      script(exitHeld, listThenEnd);
      expect((await sb.commands.run(['true'])).outcome).toBe('ok');
      await sb.commands.list();
    }
    // Two sockets take turns; cutting each run's connection instead would open one per round.
    expect(connectionsOpened - before).toBeLessThanOrEqual(2);
  });

  it('cuts the connection of a stream left early: a stopped watch ends its request on the server', async () => {
    const sb = await sandbox();
    let reply: ServerResponse | undefined;
    script((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/x-ndjson' });
      res.write(`${JSON.stringify({ type: 'create', path: '/workspace/x' })}\n`);
      reply = res;
    });
    let resolveFirst: () => void = () => undefined;
    const first = new Promise<void>((resolve) => (resolveFirst = resolve));
    const watch = await sb.files.watch('/workspace', { onEvent: () => resolveFirst() });
    await first;
    watch.stop();
    await watch.done;
    await closed(reply);
    expect(reply?.writableEnded).toBe(false);
  });

  it('times the whole JSON call out, but only the headers of a stream', async () => {
    let stalled: ServerResponse | undefined;
    script((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.write('{"sandboxes":');
      stalled = res;
    });
    expect(await thrown(Sandbox.list({ url, timeoutMs: 100 }))).toBeInstanceOf(TimeoutError);
    await closed(stalled);

    const sb = await sandbox();
    script((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/x-ndjson' });
      res.write(`${JSON.stringify({ type: 'start', pid: 2 })}\n`);
      // Ordered, not raced: this timer is set after the client's 100 ms one (the request has
      // arrived) and expires later, and both run in this process, which fires timers in order.
      setTimeout(() => res.end(`${JSON.stringify({ type: 'exit', result: RESULT })}\n`), 300);
    });
    expect((await sb.commands.run(['sleep', '0.3'], { requestTimeoutMs: 100 })).outcome).toBe('ok');
  });

  it('fails at once on an already aborted signal, sending nothing', async () => {
    const error = await thrown(Sandbox.list({ url, signal: AbortSignal.abort() }));
    expect(error).toBeInstanceOf(AbortedError);
    expect((error as CapsuleError).message).toBe("GET /v1/sandboxes was aborted by the caller's AbortSignal");
    expect(seen).toHaveLength(0);
  });

  it('uploads a web stream chunked and bytes with a length, and does not retry a stream', async () => {
    const sb = await sandbox();
    const entry = { name: 'a', path: '/workspace/a', type: 'file', size: 3, mode: 0o644, modifiedAt: '' };
    script(json(200, entry), json(200, entry), json(200, entry), json(503, { code: 'BACKEND_UNAVAILABLE', message: 'busy', requestId: 'r' }));
    const web = () =>
      new ReadableStream<Uint8Array>({
        start(controller) {
          controller.enqueue(new TextEncoder().encode('web '));
          controller.enqueue(new TextEncoder().encode('stream'));
          controller.close();
        },
      });
    await sb.files.write('a', web());
    await sb.files.write('b', new Blob(['blob']));
    await sb.files.write('c', new TextEncoder().encode('buffer').buffer);
    expect(await thrown(sb.files.write('d', web()))).toMatchObject({ code: 'BACKEND_UNAVAILABLE' });
    expect(seen.map((r) => r.body.toString())).toEqual(['web stream', 'blob', 'buffer', 'web stream']);
    expect(seen[0]?.headers['transfer-encoding']).toBe('chunked');
    expect(seen[1]?.headers['content-length']).toBe('4');
    expect(seen[2]?.headers['content-length']).toBe('6');
  });

  it('reads bytes into a Uint8Array of their own, and fails a stream read cut mid-body with ConnectionError', async () => {
    const sb = await sandbox();
    script(
      (_req, res) => res.writeHead(200, { 'content-type': 'application/octet-stream' }).end('abc'),
      (_req, res) => {
        res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': '100' });
        res.write('partial', () => res.socket?.destroy());
      },
    );
    const bytes = await sb.files.read('a', { format: 'bytes' });
    expect(bytes.constructor).toBe(Uint8Array);
    expect(bytes.buffer.byteLength).toBe(3);
    const stream = await sb.files.read('a', { format: 'stream' });
    const error = await thrown(new Response(stream).text());
    expect(error).toBeInstanceOf(ConnectionError);
    expect((error as CapsuleError).message).toMatch(/^reading the reply: cannot reach the Capsule server/);
  });

  it('cancels a stream read whose body had arrived whole', async () => {
    const sb = await sandbox();
    script((_req, res) => {
      // Ten chunks in one packet: all of the body is there, unread, when the reader cancels.
      res.writeHead(200, { 'content-type': 'application/octet-stream' });
      res.cork();
      for (let i = 0; i < 10; i++) res.write('x'.repeat(1000));
      res.end();
    }, json(200, INFO));
    const reader = (await sb.files.read('a', { format: 'stream' })).getReader();
    expect((await reader.read()).done).toBe(false);
    await reader.cancel();
    expect((await sb.getInfo()).sandboxId).toBe(INFO.sandboxId);
  });

  it('puts the path of the configured URL before every request path', async () => {
    script(json(200, { sandboxes: [], nextCursor: null }));
    await Sandbox.list({ url: `${url}/capsule/`, state: 'running' });
    expect(seen[0]?.url.pathname).toBe('/capsule/v1/sandboxes');
    expect(seen[0]?.url.searchParams.get('state')).toBe('running');
  });
});

describe('SDK over a transport other than HTTP', () => {
  /** A transport answering from a script, recording what it was asked: the layer below the SDK's client. */
  function scripted(...replies: { status: number; body: unknown }[]): { transport: Transport; asked: TransportRequest[] } {
    const asked: TransportRequest[] = [];
    const transport: Transport = {
      send: (request) => {
        asked.push(request);
        const reply = replies.shift();
        if (!reply) throw new Error('no scripted reply left');
        const body = Object.assign(Readable.from([Buffer.from(JSON.stringify(reply.body))], { objectMode: false }), {
          statusCode: reply.status,
          headers: { 'content-type': 'application/json' },
          complete: true,
        });
        return Promise.resolve(body);
      },
    };
    return { transport, asked };
  }

  it('sends each call once, with no idempotency key, and nothing to the URL (the scripted server there sees nothing)', async () => {
    const { transport, asked } = scripted({ status: 503, body: { code: 'BACKEND_UNAVAILABLE', message: 'busy', requestId: 'r' } });
    const error = await thrown(Sandbox.create(undefined, { url, apiKey: 'k1', transport }));
    expect(error).toMatchObject({ code: 'BACKEND_UNAVAILABLE', status: 503 });
    expect(asked).toHaveLength(1);
    expect(asked[0]).toMatchObject({ method: 'POST', origin: new URL(url).origin, path: '/v1/sandboxes' });
    expect(asked[0]?.headers.authorization).toBe('Bearer k1');
    expect(asked[0]?.headers['idempotency-key']).toBeUndefined();
    expect(seen).toHaveLength(0);
  });

  it('cancels a call whose reply has not come: the transport sees its signal aborted', async () => {
    const asked: TransportRequest[] = [];
    const transport: Transport = { send: (request) => (asked.push(request), new Promise(() => undefined)) };
    const stop = new AbortController();
    const pending = thrown(Sandbox.connect('x', { url, transport, signal: stop.signal }));
    await waitUntil(() => asked.length === 1);
    stop.abort();
    expect(await pending).toBeInstanceOf(AbortedError);
    expect(asked[0]?.signal.aborted).toBe(true);
  });
});

async function waitUntil(check: () => boolean): Promise<void> {
  for (let i = 0; i < 1000 && !check(); i++) await new Promise((resolve) => setImmediate(resolve));
  expect(check()).toBe(true);
}
