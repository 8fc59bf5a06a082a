import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { connect, createServer, type AddressInfo, type Server, type Socket } from 'node:net';
import { createServer as createHttpServer, type Server as HttpServer } from 'node:http';
import { expectNoLeaks } from '../helpers/sandbox.js';
import { EgressProxy, type EgressEvent } from '../../src/host/egress/egress-proxy.js';
import { ForbiddenAddresses } from '../../src/host/egress/addresses.js';
import { parseSpec } from '../../src/sandbox-spec/index.js';

/*
 * The proxy's connection limits and timeouts (issue 11, finding 3), on 127.0.0.1 with free ports:
 * this test process plays the sandbox (127.0.0.1 is registered) and the upstreams are servers on
 * loopback (the proxy is told no address is forbidden, so it may reach them). Timeouts are short
 * here; tests wait for the close they cause, with a generous deadline, and never measure time.
 */
const events: EgressEvent[] = [];
const upstreamSockets = new Set<Socket>();
let echo: Server;
let silent: HttpServer;

interface ProxyOptions {
  maxDescriptors?: number;
  handshakeTimeoutMs?: number;
  idleTimeoutMs?: number;
  recordConnections?: (sandboxId: string, upTo: number) => void;
}

function startProxy(options: ProxyOptions = {}): EgressProxy {
  const { maxDescriptors, recordConnections, ...timeouts } = options;
  return new EgressProxy({
    address: '127.0.0.1',
    ports: { proxy: 0, http: 0, tls: 0, dns: 0 },
    forbidden: new ForbiddenAddresses([]),
    log: () => undefined,
    timeouts: { handshakeTimeoutMs: 60_000, idleTimeoutMs: 60_000, ...timeouts },
    ...(maxDescriptors === undefined ? {} : { maxDescriptors }),
    ...(recordConnections === undefined ? {} : { recordConnections }),
  });
}

let proxy: EgressProxy | undefined;
async function withProxy(options: ProxyOptions, maxConcurrentConnections = 256, maxConnections?: number): Promise<EgressProxy> {
  proxy = startProxy(options);
  await proxy.start();
  const network = { mode: 'internet', maxConcurrentConnections, ...(maxConnections === undefined ? {} : { maxConnections }) };
  proxy.register('limits', '127.0.0.1', parseSpec({ network }).network);
  proxy.onEvent((e) => events.push(e));
  return proxy;
}

beforeAll(async () => {
  echo = createServer((socket) => {
    upstreamSockets.add(socket);
    socket.once('close', () => upstreamSockets.delete(socket));
    socket.pipe(socket);
  });
  await new Promise<void>((resolve) => echo.listen(0, '127.0.0.1', resolve));
  // Takes requests and never answers them.
  silent = createHttpServer(() => undefined);
  await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve));
});
afterAll(async () => {
  silent.closeAllConnections();
  await new Promise((resolve) => silent.close(resolve));
  await new Promise((resolve) => echo.close(resolve));
});
afterEach(async () => {
  await proxy?.close();
  proxy = undefined;
  events.length = 0;
  await expectNoLeaks();
});

const echoPort = (): number => (echo.address() as AddressInfo).port;

/** A connection to one of the proxy's ports, with what it received and how it closed. */
interface Client {
  socket: Socket;
  received: () => string;
  closed: Promise<'reset' | 'closed'>;
}
function open(port: number, send?: string): Client {
  let text = '';
  let reset = false;
  const socket = connect(port, '127.0.0.1', () => {
    if (send !== undefined) socket.write(send);
  });
  socket.on('data', (chunk: Buffer) => (text += chunk.toString()));
  socket.on('error', (error: NodeJS.ErrnoException) => (reset ||= error.code === 'ECONNRESET'));
  const closed = new Promise<'reset' | 'closed'>((done) => socket.once('close', () => done(reset ? 'reset' : 'closed')));
  return { socket, received: () => text, closed };
}

async function until(check: () => boolean, what: string): Promise<void> {
  const deadline = Date.now() + 15_000;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

const tunnel = (port: number): Client => open(port, `CONNECT 127.0.0.1:${echoPort()} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n`);

describe('egress proxy limits and timeouts', () => {
  it('resets connections past the sandbox\'s maxConcurrentConnections at accept, counted as egress limits, and takes new ones once some close', async () => {
    const p = await withProxy({}, 3);
    const held = [1, 2, 3].map(() => tunnel(p.ports.proxy));
    for (const client of held) await until(() => client.received().startsWith('HTTP/1.1 200'), 'a tunnel');
    const refused = open(p.ports.proxy);
    expect(await refused.closed).toBe('reset');
    expect(p.stats('limits')).toMatchObject({ limitHits: 1, concurrencyLimitHits: 1, capacityLimitHits: 0, openConnections: 6 });
    expect(events.at(-1)).toMatchObject({ kind: 'limited', code: 'EGRESS_LIMIT', rule: 'network.maxConcurrentConnections' });
    expect(events.at(-1)?.message).toMatch(/^concurrent connection limit 3 reached/);
    // The tunnels work, and a closed one frees its place.
    held[0]!.socket.write('ping');
    await until(() => held[0]!.received().endsWith('ping'), 'the echo');
    held[0]!.socket.destroy();
    await until(() => p.stats('limits')?.openConnections === 4, 'the slot to be released');
    const next = tunnel(p.ports.proxy);
    await until(() => next.received().startsWith('HTTP/1.1 200'), 'a new tunnel');
    for (const client of [...held, next]) client.socket.destroy();
  });

  it('counts upstream connections too: pipelined requests past the limit get 429, and go when the connection goes', async () => {
    const p = await withProxy({}, 2);
    const target = `http://127.0.0.1:${(silent.address() as AddressInfo).port}/`;
    const client = open(p.ports.proxy, `GET ${target} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n`.repeat(4));
    // Node reads pipelined requests at once: two go upstream (the silent one holds them), the
    // others are refused, their 429s queued behind the first answer.
    await until(() => p.stats('limits')?.concurrencyLimitHits === 2, 'two refusals');
    expect(p.stats('limits')).toMatchObject({ connections: 2, openConnections: 3 });
    expect(events.map((e) => e.rule)).toEqual(['network.maxConcurrentConnections', 'network.maxConcurrentConnections']);
    client.socket.destroy();
    await until(() => p.stats('limits')?.openConnections === 0 && p.descriptorUse().inUse === 0, 'the upstreams to go with the connection');
  });

  it("refuses connections past the proxy's descriptor budget for all sandboxes, counted as capacity", async () => {
    const p = await withProxy({ maxDescriptors: 4 });
    const held = [1, 2].map(() => tunnel(p.ports.proxy));
    for (const client of held) await until(() => client.received().startsWith('HTTP/1.1 200'), 'a tunnel');
    expect(p.descriptorUse()).toEqual({ inUse: 4, total: 4 });
    const refused = open(p.ports.http);
    expect(await refused.closed).toBe('reset');
    expect(p.stats('limits')).toMatchObject({ limitHits: 1, capacityLimitHits: 1, concurrencyLimitHits: 0 });
    expect(events.at(-1)).toMatchObject({ kind: 'limited', rule: 'proxy-capacity' });
    for (const client of held) client.socket.destroy();
    await until(() => p.descriptorUse().inUse === 0, 'the descriptors to be given back');
  });

  it('refuses a connection whose connection bound cannot be written (a full data disk) with a classified 503, gives its slot back and records the bound on the next one', async () => {
    let diskFull = true;
    const recorded: number[] = [];
    const recordConnections = (sandboxId: string, upTo: number): void => {
      if (diskFull) throw Object.assign(new Error('ENOSPC: no space left on device, write'), { code: 'ENOSPC' });
      recorded.push(upTo);
    };
    // 128 connections: a bound is written every 2 (a 64th).
    const p = await withProxy({ recordConnections }, 256, 128);
    const refused = tunnel(p.ports.proxy);
    expect(await refused.closed).toBe('closed');
    expect(refused.received()).toMatch(/^HTTP\/1\.1 503 Service Unavailable\r\n/);
    const body = JSON.parse(refused.received().slice(refused.received().indexOf('\r\n\r\n') + 4)) as Record<string, string>;
    expect(body).toMatchObject({ code: 'EGRESS_LIMIT', rule: 'connection-record', destination: `127.0.0.1:${echoPort()}` });
    expect(body.message).toMatch(/cannot record this sandbox's connection count \(the data disk is full\)/);
    expect(events.at(-1)).toMatchObject({ kind: 'limited', code: 'EGRESS_LIMIT', rule: 'connection-record' });
    // Nothing counted, nothing held: the upstream slot went back with the refusal.
    await until(() => p.descriptorUse().inUse === 0, 'the descriptors to be given back');
    expect(p.stats('limits')).toMatchObject({ connections: 0, openConnections: 0, limitHits: 1, capacityLimitHits: 1, lifetimeLimitHits: 0 });
    expect(recorded).toEqual([]);
    // With room again, the next connection writes the bound it counts up to before it opens.
    diskFull = false;
    const next = tunnel(p.ports.proxy);
    await until(() => next.received().startsWith('HTTP/1.1 200'), 'a tunnel');
    expect(recorded).toEqual([2]);
    expect(p.stats('limits')).toMatchObject({ connections: 1 });
    next.socket.destroy();
    await until(() => p.descriptorUse().inUse === 0, 'the descriptors to be given back');
  });

  it('closes a connection that names no destination within the handshake timeout, on every port', async () => {
    const p = await withProxy({ handshakeTimeoutMs: 300 });
    const quiet = [p.ports.proxy, p.ports.http, p.ports.tls].map((port) => open(port));
    const partial = open(p.ports.proxy, 'CONNECT 127.0.0.1:1 HTTP/1.1\r\n'); // never finishes its head
    for (const client of [...quiet, partial]) await client.closed;
    await until(() => p.descriptorUse().inUse === 0, 'the descriptors to be given back');
  });

  it('closes an idle tunnel on both sides, and keeps a busy one open', async () => {
    const p = await withProxy({ idleTimeoutMs: 600 });
    const idle = tunnel(p.ports.proxy);
    const busy = tunnel(p.ports.proxy);
    await until(() => idle.received().startsWith('HTTP/1.1 200') && busy.received().startsWith('HTTP/1.1 200'), 'the tunnels');
    expect(upstreamSockets.size).toBe(2);
    // The busy one talks every 100 ms until the idle one is gone.
    let idleGone = false;
    void idle.closed.then(() => (idleGone = true));
    let sent = 0;
    while (!idleGone) {
      busy.socket.write('.');
      sent += 1;
      await new Promise((resolve) => setTimeout(resolve, 100));
      if (sent > 150) throw new Error('the idle tunnel was never closed');
    }
    await until(() => upstreamSockets.size === 1, 'the idle tunnel\'s upstream to close');
    expect(busy.socket.destroyed).toBe(false);
    busy.socket.destroy();
    await until(() => upstreamSockets.size === 0 && p.descriptorUse().inUse === 0, 'everything to close');
  });

  it('ends a proxied request whose upstream stays silent past the idle timeout with 502', async () => {
    const p = await withProxy({ idleTimeoutMs: 300 });
    const target = `http://127.0.0.1:${(silent.address() as AddressInfo).port}/slow`;
    const client = open(p.ports.proxy, `GET ${target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n`);
    await client.closed;
    expect(client.received()).toMatch(/^HTTP\/1\.1 502 /);
    expect(client.received()).toContain('EGRESS_UPSTREAM_FAILED');
    expect(client.received()).toContain("the proxy's idle timeout");
  });

  it('refuses timeouts that are not positive whole milliseconds', () => {
    expect(() => startProxy({ idleTimeoutMs: 0 })).toThrow(/idleTimeoutMs must be a positive whole number/);
    expect(() => startProxy({ handshakeTimeoutMs: 1.5 })).toThrow(/handshakeTimeoutMs/);
  });
});
