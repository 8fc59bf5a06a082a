/**
 * Calls made in the server's own process (decision 024): the SDK over the seam's in-process
 * transport, as MCP's tools use it, against a real server with real sandboxes and two tenants.
 * The same seam must hold as over HTTP: keys checked, tenants apart, input validated, every
 * mutating call audited under the caller's key, errors with their codes, a cancelled call ended.
 */
import { Readable } from 'node:stream';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { AbortedError, AuthenticationError, InvalidArgumentError, Sandbox, SandboxNotFoundError, type ConnectionOptions } from '../../src/sdk/index.js';
import type { Transport, TransportReply } from '../../src/sdk/http.js';
import { expectNoLeaks } from '../helpers/sandbox.js';
import { startTestServer, waitFor, type TestServer } from './server-helpers.js';

let t: TestServer;
let transport: Transport;
let otherKey = '';

beforeAll(async () => {
  t = await startTestServer();
  transport = t.server.app.services.calls.transport(t.server.app.app.log);
  otherKey = (await t.json<{ apiKey: string }>('POST', '/v1/keys', { body: { tenantId: 'in-process-other' } })).body.apiKey;
});

afterAll(async () => {
  await t?.server.close();
});

afterEach(async () => {
  await expectNoLeaks();
});

/** The SDK as MCP's tools hold it: the server's URL (for what it hands back) and the in-process transport. */
function inProcess(apiKey: string): ConnectionOptions {
  return { url: t.url, apiKey, transport };
}

async function text(reply: TransportReply): Promise<string> {
  let out = '';
  for await (const chunk of reply) out += String(chunk);
  return out;
}

describe('the SDK over the in-process transport', () => {
  it('runs a sandbox: files up and down, a foreground and a background command, audited under the key', async () => {
    const sandbox = await Sandbox.create({}, inProcess(t.apiKey));
    try {
      await sandbox.files.write('/workspace/hello.sh', 'echo "hello $1"; echo oops >&2; exit 3\n');
      // A body streamed as it is read (not replayable): its chunks reach the route as a stream.
      const streamed = Readable.from([new TextEncoder().encode('streamed '), new TextEncoder().encode('upload')]);
      await sandbox.files.write('/workspace/streamed.txt', streamed);
      expect(await sandbox.files.read('/workspace/streamed.txt')).toBe('streamed upload');

      const result = await sandbox.commands.run(['sh', '/workspace/hello.sh', 'world']);
      expect(result).toMatchObject({ exitCode: 3, stdout: 'hello world\n', stderr: 'oops\n' });

      const handle = await sandbox.commands.run(['sh', '-c', 'sleep 0.2; echo later'], { background: true });
      const reattached = await sandbox.commands.connect(handle.pid);
      expect((await reattached.wait()).stdout).toBe('later\n');

      // What the server saw: the same operations, attempts and outcomes, the operator key's tenant.
      const records = t.server.app.services.audit.list({ limit: 1000 }).filter((record) => record.sandboxId === sandbox.sandboxId);
      const starts = records.filter((record) => record.operation === 'processes.start');
      expect(starts.map((record) => record.phase)).toEqual(expect.arrayContaining(['attempt', 'outcome']));
      const keyId = t.server.app.services.keys.verify(t.apiKey)?.keyId;
      expect(keyId).toBeDefined();
      expect(starts.every((record) => record.tenantId === 'default' && record.keyId === keyId && record.requestId?.startsWith('req_'))).toBe(true);
      expect(records.map((record) => record.operation)).toEqual(expect.arrayContaining(['sandboxes.create', 'files.write', 'processes.start']));
    } finally {
      await sandbox.kill();
    }
  }, 60_000);

  it('checks the key and keeps tenants apart, as over HTTP', async () => {
    await expect(Sandbox.list(inProcess('cap_0000000000000000000000000000000000000000'))).rejects.toBeInstanceOf(AuthenticationError);
    const owned = await Sandbox.create({}, inProcess(t.apiKey));
    try {
      await expect(Sandbox.connect(owned.sandboxId, inProcess(otherKey))).rejects.toBeInstanceOf(SandboxNotFoundError);
      const other = await Sandbox.create({}, inProcess(otherKey));
      try {
        const page = await Sandbox.list({ ...inProcess(otherKey), state: 'running' });
        expect(page.sandboxes.map((info) => info.sandboxId)).toEqual([other.sandboxId]);
      } finally {
        await other.kill();
      }
    } finally {
      await owned.kill();
    }
  }, 60_000);

  it('validates input and answers errors with their code and request id', async () => {
    const refused = await Sandbox.create({ limits: { memoryMb: 64 } } as never, inProcess(t.apiKey)).catch((error: unknown) => error);
    expect(refused).toBeInstanceOf(InvalidArgumentError);
    expect(refused).toMatchObject({ code: expect.stringMatching(/^INVALID_/) as unknown, requestId: expect.stringMatching(/^req_/) as unknown });
  });

  it('reaches the API only: MCP, the E2B facade and a sandbox port answer over HTTP alone', async () => {
    const sandbox = await Sandbox.create({}, inProcess(t.apiKey));
    try {
      for (const path of ['/mcp', '/sandboxes', `/v1/sandboxes/${sandbox.sandboxId}/ports/8080/`]) {
        const reply = await transport.send({ method: 'GET', origin: t.url, path, headers: { authorization: `Bearer ${t.apiKey}` }, body: undefined, signal: new AbortController().signal });
        expect({ path, status: reply.statusCode }).toEqual({ path, status: 404 });
        expect(JSON.parse(await text(reply))).toMatchObject({ code: 'NOT_FOUND' });
      }
      // A URL handed back is built on the origin the SDK was given, as over HTTP on the Host.
      const signed = await sandbox.portUrl(8080);
      expect(signed.url.startsWith(`${t.url}/v1/sandboxes/${sandbox.sandboxId}/ports/8080/`)).toBe(true);
    } finally {
      await sandbox.kill();
    }
  }, 60_000);

  it('ends a call its caller cancels: the run rejects and its process is killed, as over HTTP', async () => {
    const sandbox = await Sandbox.create({}, inProcess(t.apiKey));
    try {
      const cancel = new AbortController();
      const running = sandbox.commands.run(['sleep', '30'], { signal: cancel.signal });
      const started = await waitFor(async () => (await sandbox.commands.list()).find((process) => process.running && process.argv[0] === 'sleep'), { what: 'the sleep to start' });
      cancel.abort();
      await expect(running).rejects.toBeInstanceOf(AbortedError);
      // The SDK ends an aborted run's process (a kill, in-process too) before it rejects. That the
      // server's side of a cancelled or abandoned call ends: test/unit/in-process-calls.test.ts.
      expect((await sandbox.commands.list()).find((process) => process.pid === started.pid)?.running).toBe(false);
    } finally {
      await sandbox.kill();
    }
  }, 60_000);
});
