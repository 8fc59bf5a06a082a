import { Agent } from 'node:http';
import type { Duplex } from 'node:stream';

/** Opens a relay to a port of a sandbox (the engine's connectPort). */
export type OpenRelay = (tenantId: string, sandboxId: string, port: number) => Promise<Duplex>;

export interface PortPoolOptions {
  /** Idle connections kept per sandbox port between requests. @default 8 */
  maxIdlePerPort?: number;
  /** An idle connection is closed after this long without a request. @default 15000 */
  idleTimeoutMs?: number;
  /** Sandbox ports with a pool at once; past it the least recently used pool is retired. @default 1024 */
  maxPorts?: number;
}

/**
 * Keep-alive connections to sandbox ports, one node:http Agent per sandbox port whose sockets are
 * agent relays. A request reuses an idle relay (and so the TCP connection inside the sandbox)
 * instead of opening both anew: what keeps the proxy's cost per request under a millisecond.
 *
 * Bounded three ways: idle relays per port (maxIdlePerPort), how long one stays idle
 * (idleTimeoutMs), and pools at once (maxPorts: past it the least recently used pool's idle
 * relays close, and its busy ones when their request is done). A pool goes as soon as its last relay closed,
 * and relays close with their sandbox (the agent client ends them all), so a pool never outlives
 * the sandbox's connections. Every idle relay counts toward the agent's 256 relays.
 */
export class PortConnectionPool {
  private readonly pools = new Map<string, Agent>();
  /** Evicted pools whose relays still carry a request: ended by close() too. */
  private readonly retired = new Set<Agent>();
  private readonly maxIdlePerPort: number;
  private readonly idleTimeoutMs: number;
  private readonly maxPorts: number;

  constructor(
    private readonly open: OpenRelay,
    options: PortPoolOptions = {},
  ) {
    this.maxIdlePerPort = options.maxIdlePerPort ?? 8;
    this.idleTimeoutMs = options.idleTimeoutMs ?? 15_000;
    this.maxPorts = options.maxPorts ?? 1024;
  }

  /** Pools that have relays now (for tests and metrics). */
  get size(): number {
    return this.pools.size;
  }

  /** The keep-alive agent of one port of one tenant's sandbox. */
  agentFor(tenantId: string, sandboxId: string, port: number): Agent {
    const key = `${tenantId}/${sandboxId}/${port}`;
    const known = this.pools.get(key);
    if (known) {
      // Most recently used last: eviction takes from the front.
      this.pools.delete(key);
      this.pools.set(key, known);
      return known;
    }
    const agent = new Agent({ keepAlive: true, maxFreeSockets: this.maxIdlePerPort, timeout: this.idleTimeoutMs, scheduling: 'lifo' });
    agent.createConnection = (_options: unknown, done: (error: Error | null, socket?: Duplex) => void) => {
      this.open(tenantId, sandboxId, port).then(
        (relay) => {
          // The server in the sandbox closed its side (an idle keep-alive timeout, a restart): so
          // does this one, so the pool drops the connection instead of handing it out again.
          relay.once('end', () => relay.end());
          relay.once('close', () => setImmediate(() => this.dropIfEmpty(key, agent)));
          done(null, relay);
        },
        (error: unknown) => {
          done(error instanceof Error ? error : new Error(String(error)));
          setImmediate(() => this.dropIfEmpty(key, agent));
        },
      );
      return undefined;
    };
    this.pools.set(key, agent);
    while (this.pools.size > this.maxPorts) {
      const [oldest, pool] = this.pools.entries().next().value as [string, Agent];
      this.pools.delete(oldest);
      retire(pool);
      if (busy(pool)) this.retired.add(pool);
    }
    return agent;
  }

  /** Closes every pooled relay (the server is shutting down). */
  close(): void {
    for (const agent of [...this.pools.values(), ...this.retired]) agent.destroy();
    this.pools.clear();
    this.retired.clear();
  }

  private dropIfEmpty(key: string, agent: Agent): void {
    if (busy(agent)) return;
    this.retired.delete(agent);
    if (this.pools.get(key) === agent) this.pools.delete(key);
  }
}

/**
 * Takes an evicted pool out of service without cutting anyone off: its idle relays close now,
 * and a relay still carrying a request (perhaps another tenant's) closes when that request is
 * done instead of going back to the pool. Agent.destroy() would end those requests midway.
 */
function retire(agent: Agent): void {
  agent.keepSocketAlive = () => false;
  for (const list of Object.values(agent.freeSockets)) for (const socket of list ?? []) socket.destroy();
}

/** Whether the agent still has a relay open or a request waiting for one. */
function busy(agent: Agent): boolean {
  const tables: Record<string, unknown[] | undefined>[] = [agent.sockets, agent.freeSockets, agent.requests];
  return tables.some((table) => Object.values(table).some((list) => (list?.length ?? 0) > 0));
}
