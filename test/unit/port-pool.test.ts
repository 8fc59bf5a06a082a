import { createServer, request, type Agent, type Server } from 'node:http';
import { connect, type AddressInfo } from 'node:net';
import type { Duplex } from 'node:stream';
import { afterEach, describe, expect, it } from 'vitest';
import { PortConnectionPool } from '../../src/server/ports/port-pool.js';

/*
 * The pool's eviction on real HTTP over loopback: the relay a sandbox port would give is here a
 * TCP connection to a server on 127.0.0.1, which is what the pool sees of a relay (a Duplex).
 */
const servers: Server[] = [];
afterEach(async () => {
  await Promise.all(servers.splice(0).map((server) => new Promise((resolve) => server.close(resolve))));
});

async function listen(handler: Parameters<typeof createServer>[1]): Promise<number> {
  const server = createServer(handler);
  servers.push(server);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  server.keepAliveTimeout = 60_000;
  return (server.address() as AddressInfo).port;
}

function get(agent: Agent, port: number, path = '/'): Promise<string> {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, path, agent }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => (body += chunk));
      res.on('end', () => resolve(body));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end();
  });
}

const countOpen = (table: NodeJS.ReadOnlyDict<unknown[]>) => Object.values(table).reduce((n, list) => n + (list?.length ?? 0), 0);

describe('PortConnectionPool eviction', () => {
  it('lets a request in flight on an evicted pool finish, and closes its relays instead of keeping them', async () => {
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    const slow = await listen((req, res) => (req.url === '/hold' ? void released.then(() => res.end('slow done')) : res.end('quick')));
    const fast = await listen((_req, res) => res.end('fast'));
    const relays: Duplex[] = [];
    const pool = new PortConnectionPool(
      async (_tenant, _sandbox, port) => {
        const socket = connect(port, '127.0.0.1');
        relays.push(socket);
        await new Promise((resolve) => socket.once('connect', resolve));
        return socket;
      },
      { maxPorts: 1 },
    );
    try {
      // Tenant a's request is in flight when tenant b's port takes the only pool place.
      // Tenant a's pool holds one idle relay (a request done) and one carrying a request in
      // flight when tenant b's port takes the only pool place.
      const evicted = pool.agentFor('a', 'sbx-a', slow);
      const inFlight = get(evicted, slow, '/hold');
      await expect.poll(() => countOpen(evicted.sockets)).toBe(1);
      expect(await get(evicted, slow)).toBe('quick');
      await expect.poll(() => countOpen(evicted.freeSockets)).toBe(1);
      const [busyRelay, idleRelay] = [relays[0]!, relays[1]!];
      expect(await get(pool.agentFor('b', 'sbx-b', fast), fast)).toBe('fast');
      // The idle relay closes at once; the busy one finishes its request first.
      await expect.poll(() => idleRelay.destroyed).toBe(true);
      expect(busyRelay.destroyed).toBe(false);
      release();
      expect(await inFlight).toBe('slow done');
      // Its relay was not handed back to the retired pool: it closed.
      await expect.poll(() => busyRelay.destroyed).toBe(true);
      expect(countOpen(evicted.freeSockets)).toBe(0);
      // The live pool keeps its idle relay for the next request.
      const live = pool.agentFor('b', 'sbx-b', fast);
      expect(countOpen(live.freeSockets)).toBe(1);
      expect(await get(live, fast)).toBe('fast');
      expect(relays).toHaveLength(3);
    } finally {
      pool.close();
    }
  });
});
