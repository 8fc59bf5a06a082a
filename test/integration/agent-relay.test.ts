/**
 * The agent's TCP relays, with the real capsule-agent run directly under node (not sandboxed):
 * it connects to servers this test runs on the host's loopback. Sandboxed use, on both backends,
 * is tested end to end in test/e2e/ports.test.ts.
 */
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { createServer, type AddressInfo, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { AgentClient, type AgentRelay } from '../../src/backends/agent/index.js';
import { RELAY_WINDOW_BYTES } from '../../src/backends/agent/protocol.js';
import { isSandboxError } from '../../src/errors/index.js';
import { buildAgent } from '../helpers/agent-binary.js';

let buildDir = '';
let agentPath = '';
const cleanups: (() => Promise<void> | void)[] = [];

interface Agent {
  child: ChildProcessWithoutNullStreams;
  client: AgentClient;
  exited: Promise<void>;
}

async function startAgent(): Promise<Agent> {
  const child = spawn(agentPath, [], { stdio: ['pipe', 'pipe', 'pipe'] });
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const client = new AgentClient(child.stdin, child.stdout);
  cleanups.push(async () => {
    client.close();
    if (child.exitCode === null && child.signalCode === null) {
      const timer = setTimeout(() => child.kill('SIGKILL'), 5000);
      await exited;
      clearTimeout(timer);
    }
  });
  await client.ready;
  return { child, client, exited };
}

/** A TCP server on the host's loopback; `onSocket` handles each connection. */
async function listen(onSocket: (socket: Socket) => void, host = '127.0.0.1'): Promise<{ server: Server; port: number; sockets: Socket[] }> {
  const sockets: Socket[] = [];
  const server = createServer((socket) => {
    sockets.push(socket);
    socket.on('error', () => undefined); // a reset is what some tests are about
    onSocket(socket);
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, host, () => resolve());
  });
  cleanups.push(
    () =>
      new Promise<void>((resolve) => {
        for (const socket of sockets) socket.destroy();
        server.close(() => resolve());
      }),
  );
  return { server, port: (server.address() as AddressInfo).port, sockets };
}

function readAll(stream: NodeJS.ReadableStream): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    stream.on('data', (chunk: Buffer) => chunks.push(chunk));
    stream.once('end', () => resolve(Buffer.concat(chunks)));
    stream.once('error', reject);
  });
}

function sha(bytes: Buffer): string {
  return createHash('sha256').update(bytes).digest('hex');
}

/**
 * The receive queue of the host's established IPv4 TCP connection from `localPort` to
 * `remotePort`. Both ends are matched: a local port alone is not unique (the kernel gives the same
 * ephemeral port to connections to other peers, and a socket in TIME_WAIT keeps its line), and
 * the first such line of another socket, with nothing queued, hid this one (a soak of the suite
 * failed so).
 */
async function receiveQueueBytes(localPort: number, remotePort: number): Promise<number> {
  const table = await readFile('/proc/net/tcp', 'utf8');
  const portOf = (address: string | undefined): number => parseInt(address?.split(':')[1] ?? '', 16);
  for (const line of table.split('\n').slice(1)) {
    const fields = line.trim().split(/\s+/);
    const established = fields[3] === '01';
    if (established && portOf(fields[1]) === localPort && portOf(fields[2]) === remotePort) return parseInt(fields[4]?.split(':')[1] ?? '0', 16);
  }
  return -1;
}

async function waitFor(condition: () => boolean | Promise<boolean>, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`condition not met within ${timeoutMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

async function rejection(promise: Promise<unknown>): Promise<unknown> {
  try {
    await promise;
  } catch (error) {
    return error;
  }
  throw new Error('expected a rejection');
}

beforeAll(async () => {
  buildDir = await mkdtemp(join(tmpdir(), 'capsule-relay-test-'));
  agentPath = await buildAgent(buildDir);
});

afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

afterAll(async () => {
  await rm(buildDir, { recursive: true, force: true });
});

describe('agent TCP relay', () => {
  it('carries bytes both ways and ends with a half close from either side', async () => {
    const { port } = await listen((socket) => {
      const chunks: Buffer[] = [];
      socket.on('data', (chunk: Buffer) => chunks.push(chunk));
      // Answers only once the host ended its side: a half-closed relay still reads.
      socket.on('end', () => socket.end(Buffer.concat([Buffer.from('got:'), ...chunks])));
    });
    const { client } = await startAgent();
    const relay = await client.connectPort(port);
    const reply = readAll(relay);
    relay.end('hello relay');
    expect((await reply).toString()).toBe('got:hello relay');
    // Both sides ended: the relay closes by itself, with nothing left to abort.
    await waitFor(() => relay.destroyed);
    expect(relay.errored).toBeNull();
  });

  it('moves megabytes both ways intact through its flow-control window', async () => {
    const upload = randomBytes(8 * 1024 * 1024 + 17);
    const download = randomBytes(6 * 1024 * 1024 + 5);
    let received: Promise<Buffer> | undefined;
    const { port } = await listen((socket) => {
      received = readAll(socket);
      socket.end(download);
    });
    const { client } = await startAgent();
    const relay = await client.connectPort(port);
    const got = readAll(relay);
    relay.end(upload);
    expect(sha(await got)).toBe(sha(download));
    await waitFor(() => received !== undefined);
    expect(sha(await received!)).toBe(sha(upload));
  });

  it('stops reading the socket while the host does not read, and resumes without loss', async () => {
    const payload = randomBytes(16 * 1024 * 1024);
    let agentSidePort = 0;
    const { port } = await listen((socket) => {
      agentSidePort = socket.remotePort ?? 0;
      socket.end(payload);
    });
    const { client } = await startAgent();
    const relay = await client.connectPort(port);
    relay.pause();
    // The agent stops reading once the window is used: the rest waits in the kernel's receive
    // queue of its socket, not in the agent or on the host.
    await waitFor(async () => agentSidePort !== 0 && (await receiveQueueBytes(agentSidePort, port)) >= 32 * 1024);
    await client.ping(); // every frame the agent sent before this answer has arrived
    expect(relay.readableLength).toBe(RELAY_WINDOW_BYTES);
    await client.ping();
    expect(relay.readableLength).toBe(RELAY_WINDOW_BYTES);
    const got = readAll(relay);
    relay.resume();
    expect(sha(await got)).toBe(sha(payload));
  });

  it('multiplexes many relays at once without mixing their bytes', async () => {
    const { port } = await listen((socket) => socket.pipe(socket));
    const { client } = await startAgent();
    const results = await Promise.all(
      Array.from({ length: 40 }, async (_, index) => {
        const relay = await client.connectPort(port);
        const body = Buffer.from(`relay ${index} `.repeat(5000));
        const echoed = readAll(relay);
        relay.end(body);
        return (await echoed).equals(body);
      }),
    );
    expect(results.every(Boolean)).toBe(true);
  });

  it('refuses a port nobody listens on with PORT_NOT_LISTENING, at once', async () => {
    const { server, port } = await listen(() => undefined);
    await new Promise<void>((resolve) => server.close(() => resolve()));
    const { client } = await startAgent();
    const error = await rejection(client.connectPort(port));
    expect(isSandboxError(error, 'PORT_NOT_LISTENING')).toBe(true);
    expect((error as Error).message).toContain(`port ${port}`);
    expect((error as { hint?: string }).hint).toContain('python3 -m http.server');
    // The agent is still usable.
    await client.ping();
  });

  it('reaches a server bound to ::1 only', async () => {
    const { port } = await listen((socket) => socket.end('from ipv6'), '::1');
    const { client } = await startAgent();
    const relay = await client.connectPort(port);
    expect((await readAll(relay)).toString()).toBe('from ipv6');
  });

  // The agent's answer to the connect and the reset can come in one read of its output: the
  // relay must not fire its error before the caller holds it (an unheard error throws, and a
  // 'close' already emitted never reaches the listener below).
  it('ends the relay when the server resets the connection (with the errno when the agent saw one)', async () => {
    const { port } = await listen((socket) => socket.resetAndDestroy());
    const { client } = await startAgent();
    const relay = await client.connectPort(port);
    // Read, as a client would: the agent reads the socket (and sees the reset) only while it
    // has the host's window to send into.
    relay.resume();
    // The agent reports the reset with its errno, whether its read saw it or the connect's
    // completion did (then the relay opens and ends at once).
    const ended = await new Promise<Error | 'closed without an error'>((resolve) => {
      relay.once('error', resolve);
      relay.once('close', () => resolve('closed without an error'));
    });
    expect(ended).toBeInstanceOf(Error);
    expect((ended as Error & { code?: string }).code).toMatch(/^(ECONNRESET|EPIPE)$/);
    expect((ended as Error).message).toContain(`port ${port}`);
    // The agent still relays.
    await client.ping();
  });

  it('fails every relay with SANDBOX_CRASHED when the agent dies', async () => {
    const { port } = await listen(() => undefined);
    const { child, client, exited } = await startAgent();
    const relay: AgentRelay = await client.connectPort(port);
    const failed = new Promise<Error>((resolve) => relay.once('error', resolve));
    child.kill('SIGKILL');
    await exited;
    expect(isSandboxError(await failed, 'SANDBOX_CRASHED')).toBe(true);
    expect(isSandboxError(await rejection(client.connectPort(port)), 'SANDBOX_CRASHED')).toBe(true);
  });

  it('closes the server side when the host destroys a relay', async () => {
    const closed: Promise<void>[] = [];
    const { port } = await listen((socket) => closed.push(new Promise((resolve) => socket.once('close', () => resolve()))));
    const { client } = await startAgent();
    const relay = await client.connectPort(port);
    await waitFor(() => closed.length === 1);
    relay.destroy();
    await closed[0];
    // And the agent still relays.
    const again = await client.connectPort(port);
    again.destroy();
  });
});
