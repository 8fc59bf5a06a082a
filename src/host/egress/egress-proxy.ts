import { createServer as createHttpServer, request as httpRequest, type IncomingMessage, type Server as HttpServer, type ServerResponse } from 'node:http';
import { createServer as createNetServer, type AddressInfo, type Server as NetServer, type Socket } from 'node:net';
import { endRaw, openTunnel, sendJson } from './tunnel.js';
import { lookup } from 'node:dns/promises';
import type { Duplex } from 'node:stream';
import type { NetworkPolicy } from '../../spec/index.js';
import type { SandboxCounters } from '../../backends/backend.js';
import { SandboxError } from '../../errors/index.js';
import { BROKER_HOST, type CredentialBroker } from './broker.js';
import { addressFamily, ForbiddenAddresses, normalizeAddress } from './addresses.js';
import { DnsResponder, type DnsQuestion } from './dns.js';
import { CompiledPolicy, DestinationList, type DenyCode, type Denial } from './policy.js';
import { parseClientHello } from './sni.js';
import { DenialLog, type EgressLogEntry } from './denial-log.js';
import { DEFAULT_EGRESS_TIMEOUTS, DescriptorBudget, type EgressTimeouts } from './connection-budget.js';

/** Ports of the proxy on its address: proxy-aware clients, redirected HTTP, redirected TLS, DNS. */
export interface EgressPorts {
  proxy: number;
  http: number;
  tls: number;
  dns: number;
}
/** DNS is served on a high port (no clash with a host resolver on *:53); nftables maps port 53 to it. */
export const DEFAULT_EGRESS_PORTS: EgressPorts = { proxy: 3128, http: 3129, tls: 3130, dns: 3153 };

export type EgressProtocol = 'http' | 'connect' | 'tls' | 'dns';

/** A denied or limited attempt, for metrics (`egress_blocked_total`) and the log. */
export interface EgressEvent {
  sandboxId: string;
  kind: 'blocked' | 'limited';
  protocol: EgressProtocol;
  /** `host:port` as the sandbox named it (the name for DNS). */
  destination: string;
  code: DenyCode;
  rule: string;
  message: string;
}

export interface EgressStats {
  /** Outbound connections and proxied requests opened. */
  connections: number;
  /** Attempts denied by policy (the per-sandbox `egressBlocked` counter). */
  blocked: number;
  /** Attempts refused by any egress limit (the three below). */
  limitHits: number;
  /** ... because `network.maxConnections` (a lifetime count) was used up. */
  lifetimeLimitHits: number;
  /** ... because the sandbox held `network.maxConcurrentConnections` open connections. */
  concurrencyLimitHits: number;
  /** ... because the proxy held its descriptor budget across all sandboxes. */
  capacityLimitHits: number;
  /** Connections of the sandbox the proxy holds open now (its side and upstream). */
  openConnections: number;
  /** The proxy's descriptor budget for all sandboxes. */
  capacity: number;
}

/** The egress part of a sandbox's counters (SandboxCounters), from the proxy's stats. */
export function egressCounters(stats: EgressStats): Pick<SandboxCounters, 'egressBlocked' | 'egressLimitHits' | 'egressConcurrencyHits' | 'egressCapacityHits' | 'egressCapacity'> {
  return {
    egressBlocked: stats.blocked,
    egressLimitHits: stats.limitHits,
    egressConcurrencyHits: stats.concurrencyLimitHits,
    egressCapacityHits: stats.capacityLimitHits,
    egressCapacity: stats.capacity,
  };
}

export interface EgressProxyOptions {
  /** The anchor address the proxy binds (never 0.0.0.0). */
  address: string;
  ports?: Partial<EgressPorts>;
  /** Operator deny list (domains, wildcards, CIDRs): overrides every sandbox's allowlist. */
  operatorDeny?: readonly string[];
  /** Name → addresses consulted before the system resolver (an operator "hosts" override). */
  hosts?: Readonly<Record<string, readonly string[]>>;
  /** Resolve only names in `hosts`; nothing goes to the system resolver (tests). @default false */
  hostsOnly?: boolean;
  broker?: CredentialBroker;
  /** @default ForbiddenAddresses.forThisHost() */
  forbidden?: ForbiddenAddresses;
  /**
   * Where denied and limited attempts are logged: the first of each sandbox + destination + rule
   * at once, its repeats summed once per `denialLogWindowMs` (`repeated`). `onEvent` listeners
   * see every attempt. @default a JSON line on stderr
   */
  log?: (entry: EgressLogEntry) => void;
  /** @default 10000 */
  denialLogWindowMs?: number;
  connectTimeoutMs?: number;
  /** @default DEFAULT_EGRESS_TIMEOUTS */
  timeouts?: Partial<EgressTimeouts>;
  /**
   * Descriptors the proxy may hold for all sandboxes together (see `descriptorBudget`); past it
   * new connections are refused and counted as egress limits, so the server's own accept() always
   * has descriptors left. @default unbounded (EgressNetwork sets it from RLIMIT_NOFILE)
   */
  maxDescriptors?: number;
  /**
   * Destination ports of redirected connections (nftables redirects these to the transparent
   * listeners and the original port is not visible to the proxy). @default { http: 80, tls: 443 }
   */
  transparentPorts?: { http: number; tls: number };
}

interface TrackedConnection {
  host: string;
  port: number;
  close(): void;
}

interface Client {
  sandboxId: string;
  tenantId: string | undefined;
  address: string;
  policy: CompiledPolicy;
  stats: EgressStats;
  tunnels: Set<TrackedConnection>;
  /** Sandbox-side connections open now. */
  downstream: number;
  /** Upstream connections (and broker requests) open now. */
  upstream: number;
}

/** An allowed connection holds an upstream slot until `release` (called once, when it closes). */
type Verdict =
  | { ok: true; address: string; release: () => void }
  | { ok: false; status: number; body: { code: string; message: string; rule?: string; destination?: string } };

const MAX_HELLO_BYTES = 20_000; // as tunnel.ts: a ClientHello is far smaller
/** The `rule` of refusals past the sandbox's concurrent-connection limit, and past the proxy's budget. */
export const CONCURRENCY_RULE = 'network.maxConcurrentConnections';
export const CAPACITY_RULE = 'proxy-capacity';
const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'proxy-authorization', 'proxy-authenticate', 'te', 'trailer', 'upgrade']);

/**
 * Capsule's egress proxy: the only thing a sandbox with a network can talk to. It serves
 * proxy-aware clients (absolute-URI HTTP and CONNECT), connections redirected by nftables (HTTP by
 * Host header, TLS by SNI), the sandboxes' resolver, and the credential broker. A sandbox is known
 * by its veth address, which it cannot change. Every decision is by name first, then by the
 * resolved address the proxy itself connects to.
 */
export class EgressProxy {
  readonly address: string;
  readonly ports: EgressPorts;
  private readonly options: EgressProxyOptions;
  private readonly operatorDeny: DestinationList;
  private readonly forbidden: ForbiddenAddresses;
  private readonly byAddress = new Map<string, Client>();
  private readonly byId = new Map<string, Client>();
  private readonly listeners = new Set<(event: EgressEvent) => void>();
  private readonly proxyServer: HttpServer;
  private readonly httpServer: HttpServer;
  private readonly tlsServer: NetServer;
  private readonly dns: DnsResponder;
  private readonly sockets = new Set<Duplex>();
  private readonly denials: DenialLog;
  private readonly timeouts: EgressTimeouts;
  private readonly descriptors: DescriptorBudget;
  /** Connections that have not named their destination yet, and the timer that closes them. */
  private readonly handshakes = new WeakMap<Duplex, NodeJS.Timeout>();

  constructor(options: EgressProxyOptions) {
    this.options = options;
    this.address = options.address;
    this.ports = { ...DEFAULT_EGRESS_PORTS, ...options.ports };
    this.operatorDeny = new DestinationList(options.operatorDeny ?? [], { coversSubdomains: true });
    this.forbidden = options.forbidden ?? ForbiddenAddresses.forThisHost();
    this.denials = new DenialLog({
      write: options.log ?? ((e) => void process.stderr.write(`capsule egress: ${JSON.stringify(e)}\n`)),
      windowMs: options.denialLogWindowMs,
    });
    // A fault in one request must never take the server process down: answer 500 and move on.
    const guard = (res: ServerResponse | Duplex) => (error: unknown): void => {
      process.stderr.write(`capsule egress: internal error: ${(error as Error).message}\n`);
      if ('headersSent' in res && !res.headersSent) sendJson(res, 500, { code: 'EGRESS_INTERNAL', message: 'the egress proxy failed on this request' });
      else res.destroy();
    };
    this.timeouts = { ...DEFAULT_EGRESS_TIMEOUTS, ...options.timeouts };
    for (const [name, value] of Object.entries(this.timeouts)) {
      if (!Number.isInteger(value) || value <= 0) {
        throw new SandboxError('INVALID_ARGUMENT', `egress ${name} must be a positive whole number of milliseconds, got ${value}`, {
          details: { field: name, value },
          hint: 'Pass e.g. --egress-idle-timeout 300000 (five minutes).',
        });
      }
    }
    this.descriptors = new DescriptorBudget(options.maxDescriptors ?? Number.MAX_SAFE_INTEGER);
    const httpOptions = { headersTimeout: this.timeouts.handshakeTimeoutMs, requestTimeout: 0, keepAliveTimeout: Math.min(5000, this.timeouts.idleTimeoutMs) };
    this.proxyServer = createHttpServer(httpOptions, (req, res) => void this.onRequest(req, res, false).catch(guard(res)));
    this.proxyServer.on('connect', (req: IncomingMessage, socket: Duplex, head: Buffer) => void this.onConnect(req, socket, head).catch(guard(socket)));
    this.httpServer = createHttpServer(httpOptions, (req, res) => void this.onRequest(req, res, true).catch(guard(res)));
    this.tlsServer = createNetServer();
    for (const [server, protocol] of [[this.proxyServer, 'http'], [this.httpServer, 'http'], [this.tlsServer, 'tls']] as const) {
      // A sandbox that stops talking mid-request is closed after the idle timeout.
      if (server !== this.tlsServer) (server as HttpServer).timeout = this.timeouts.idleTimeoutMs;
      server.on('connection', (socket: Socket) => {
        if (this.admit(socket, protocol) && server === this.tlsServer) this.onTls(socket);
      });
    }
    this.dns = new DnsResponder({ address: this.address, port: this.ports.dns, answer: (source, q) => this.answerDns(source, q) });
  }

  async start(): Promise<void> {
    // Port 0 picks a free port (tests); `ports` then holds the one in use.
    const listen = (server: NetServer | HttpServer, key: keyof EgressPorts): Promise<void> =>
      new Promise((resolve, reject) => {
        server.once('error', reject);
        server.listen({ host: this.address, port: this.ports[key], exclusive: true }, () => {
          server.off('error', reject);
          server.unref();
          this.ports[key] = (server.address() as AddressInfo).port;
          resolve();
        });
      });
    await listen(this.proxyServer, 'proxy');
    await listen(this.httpServer, 'http');
    await listen(this.tlsServer, 'tls');
    this.ports.dns = await this.dns.start();
  }

  async close(): Promise<void> {
    for (const socket of this.sockets) socket.destroy();
    const closing = [this.proxyServer, this.httpServer, this.tlsServer].map(
      (server) => new Promise<void>((resolve) => server.close(() => resolve())),
    );
    await Promise.all([...closing, this.dns.close()]);
    this.denials.close();
    this.byAddress.clear();
    this.byId.clear();
  }

  /** Starts serving a sandbox whose veth address is `address`; `tenantId` is what the broker grants by. */
  register(sandboxId: string, address: string, policy: NetworkPolicy, tenantId?: string): void {
    const client: Client = {
      sandboxId,
      tenantId,
      address,
      policy: new CompiledPolicy(policy, this.operatorDeny),
      stats: { connections: 0, blocked: 0, limitHits: 0, lifetimeLimitHits: 0, concurrencyLimitHits: 0, capacityLimitHits: 0, openConnections: 0, capacity: this.descriptors.total },
      tunnels: new Set(),
      downstream: 0,
      upstream: 0,
    };
    this.byAddress.set(address, client);
    this.byId.set(sandboxId, client);
  }

  /**
   * Replaces a sandbox's policy. It applies to the next connection at once; open connections the
   * new policy would not allow are closed.
   */
  update(sandboxId: string, policy: NetworkPolicy): void {
    const client = this.byId.get(sandboxId);
    if (!client) return;
    client.policy = new CompiledPolicy(policy, this.operatorDeny);
    for (const tunnel of client.tunnels) {
      if (client.policy.checkName(tunnel.host, tunnel.port)) tunnel.close();
    }
  }

  /** Stops serving a sandbox and closes its connections. */
  unregister(sandboxId: string): void {
    const client = this.byId.get(sandboxId);
    if (!client) return;
    for (const tunnel of client.tunnels) tunnel.close();
    this.byId.delete(sandboxId);
    if (this.byAddress.get(client.address) === client) this.byAddress.delete(client.address);
  }

  stats(sandboxId: string): EgressStats | undefined {
    const client = this.byId.get(sandboxId);
    return client ? { ...client.stats, openConnections: client.downstream + client.upstream } : undefined;
  }

  /** Descriptors the proxy holds now for all sandboxes, and its budget. */
  descriptorUse(): { inUse: number; total: number } {
    return { inUse: this.descriptors.inUse, total: this.descriptors.total };
  }

  /** Subscribes to denied and limited attempts; returns the unsubscribe function. */
  onEvent(listener: (event: EgressEvent) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  private clientOf(socket: { remoteAddress?: string | undefined }): Client | undefined {
    return this.byAddress.get(normalizeAddress(socket.remoteAddress ?? ''));
  }

  private report(client: Client, kind: EgressEvent['kind'], protocol: EgressProtocol, destination: string, denial: Denial): void {
    if (kind === 'blocked') client.stats.blocked += 1;
    else {
      client.stats.limitHits += 1;
      if (denial.rule === CONCURRENCY_RULE) client.stats.concurrencyLimitHits += 1;
      else if (denial.rule === CAPACITY_RULE) client.stats.capacityLimitHits += 1;
      else client.stats.lifetimeLimitHits += 1;
    }
    const event: EgressEvent = { sandboxId: client.sandboxId, kind, protocol, destination, code: denial.code, rule: denial.rule, message: denial.message };
    this.denials.record(event);
    for (const listener of this.listeners) listener(event);
  }

  /**
   * Takes a sandbox-side connection in, or refuses it at once with a reset (counted as an egress
   * limit) when the sandbox holds its `maxConcurrentConnections` or the proxy its descriptor
   * budget. Admitted, it must name its destination within the handshake timeout.
   */
  private admit(socket: Socket, protocol: EgressProtocol): boolean {
    socket.on('error', () => undefined);
    const client = this.clientOf(socket);
    const limit = client && client.downstream >= client.policy.maxConcurrentConnections ? this.concurrencyDenial(client) : undefined;
    if (limit || !this.descriptors.tryTake()) {
      if (client) this.report(client, 'limited', protocol, `${normalizeAddress(socket.localAddress ?? '')}:${socket.localPort ?? 0}`, limit ?? this.capacityDenial());
      socket.resetAndDestroy();
      return false;
    }
    if (client) client.downstream += 1;
    this.sockets.add(socket);
    const timer = setTimeout(() => socket.resetAndDestroy(), this.timeouts.handshakeTimeoutMs).unref();
    this.handshakes.set(socket, timer);
    socket.once('close', () => {
      clearTimeout(timer);
      this.sockets.delete(socket);
      this.descriptors.give();
      if (client) client.downstream -= 1;
    });
    return true;
  }

  /** The connection named its destination: the handshake timer stops (idle timeouts apply from here). */
  private handshaken(socket: Duplex): void {
    const timer = this.handshakes.get(socket);
    if (timer) clearTimeout(timer);
    this.handshakes.delete(socket);
  }

  private concurrencyDenial(client: Client): Denial {
    const max = client.policy.maxConcurrentConnections;
    return {
      code: 'EGRESS_LIMIT',
      rule: CONCURRENCY_RULE,
      message: `concurrent connection limit ${max} reached: the sandbox holds ${max} open connections through the egress proxy; close idle ones, reuse them (HTTP keep-alive) or raise network.maxConcurrentConnections`,
    };
  }

  private capacityDenial(): Denial {
    return {
      code: 'EGRESS_LIMIT',
      rule: CAPACITY_RULE,
      message: `the egress proxy holds its maximum of ${this.descriptors.total} descriptors for all sandboxes; retry later, and close connections you do not use`,
    };
  }

  /**
   * Takes an upstream slot for an allowed connection (or broker request): the sandbox's
   * concurrent limit counts upstream connections too, and each uses a descriptor. Undefined and
   * a refusal reported when there is none.
   */
  private claimUpstream(client: Client, protocol: EgressProtocol, destination: string): (() => void) | Denial {
    const denial = client.upstream >= client.policy.maxConcurrentConnections ? this.concurrencyDenial(client) : this.descriptors.tryTake() ? undefined : this.capacityDenial();
    if (denial) {
      this.report(client, 'limited', protocol, destination, denial);
      return denial;
    }
    client.upstream += 1;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      client.upstream -= 1;
      this.descriptors.give();
    };
  }

  /** Name rules, then the connection limits, then resolution and the address rules. */
  private async decide(client: Client, host: string, port: number, protocol: EgressProtocol): Promise<Verdict> {
    const destination = `${host}:${port}`;
    const deny = (denial: Denial, kind: EgressEvent['kind'] = 'blocked'): Verdict => {
      this.report(client, kind, protocol, destination, denial);
      return { ok: false, status: kind === 'limited' ? 429 : 403, body: { code: denial.code, message: denial.message, rule: denial.rule, destination } };
    };
    const byName = client.policy.checkName(host, port);
    if (byName) return deny(byName);
    if (client.stats.connections >= client.policy.maxConnections) {
      const max = client.policy.maxConnections;
      return deny({ code: 'EGRESS_LIMIT', rule: 'network.maxConnections', message: `outbound connection limit ${max} reached; raise network.maxConnections or open fewer connections` }, 'limited');
    }
    let addresses: string[];
    try {
      addresses = await this.resolve(host);
    } catch (error) {
      return { ok: false, status: 502, body: { code: 'EGRESS_RESOLVE_FAILED', message: `cannot resolve ${host}: ${(error as Error).message}`, destination } };
    }
    for (const address of addresses) {
      const byAddress = client.policy.checkAddress(host, address, port, this.forbidden);
      if (byAddress) return deny(byAddress);
    }
    const address = addresses[0];
    if (address === undefined) return { ok: false, status: 502, body: { code: 'EGRESS_RESOLVE_FAILED', message: `${host} has no address`, destination } };
    const release = this.claimUpstream(client, protocol, destination);
    if (typeof release !== 'function') return { ok: false, status: 429, body: { code: release.code, message: release.message, rule: release.rule, destination } };
    client.stats.connections += 1;
    return { ok: true, address, release };
  }

  private async resolve(host: string): Promise<string[]> {
    const literal = normalizeAddress(host);
    if (addressFamily(literal)) return [literal];
    const mapped = this.options.hosts?.[host];
    if (mapped) return [...mapped];
    if (this.options.hostsOnly) throw new Error('not in the proxy\'s hosts map (hostsOnly)');
    const found = await lookup(host, { all: true, verbatim: true });
    return found.map((entry) => entry.address);
  }

  private answerDns(source: string, question: DnsQuestion): readonly string[] | undefined {
    const client = this.byAddress.get(source);
    if (!client) return undefined;
    if (question.name === BROKER_HOST && client.policy.handles.size > 0) return [this.address];
    if (client.policy.isNameResolvable(question.name)) return [this.address];
    const denial: Denial = client.policy.mode === 'none'
      ? { code: 'EGRESS_NETWORK_DISABLED', rule: 'mode:none', message: `DNS ${question.name} denied: network policy is "none"` }
      : { code: 'EGRESS_NOT_ALLOWED', rule: 'dns-allowlist', message: `DNS ${question.name} denied: the name is not in this sandbox's allowlist (the resolver answers only allowed names and forwards nothing)` };
    this.report(client, 'blocked', 'dns', question.name, denial);
    return undefined;
  }

  private async onRequest(req: IncomingMessage, res: ServerResponse, transparent: boolean): Promise<void> {
    this.handshaken(req.socket);
    const client = this.clientOf(req.socket);
    if (!client) return sendJson(res, 403, { code: 'EGRESS_UNKNOWN_SOURCE', message: 'this address is not a Capsule sandbox' });
    let target: URL;
    try {
      if (transparent) {
        if (!req.headers.host) throw new Error('no Host header');
        target = new URL(req.url ?? '/', `http://${req.headers.host}`);
        if (!target.port) target.port = String(this.options.transparentPorts?.http ?? 80);
      } else {
        target = new URL(req.url ?? '');
        if (target.protocol !== 'http:') throw new Error('not an http URL');
      }
    } catch {
      return sendJson(res, 400, {
        code: 'EGRESS_BAD_REQUEST',
        message: 'the egress proxy takes absolute-URI HTTP requests (http://host/path) and CONNECT host:port for anything else',
      });
    }
    const host = target.hostname.replace(/^\[|\]$/g, '').toLowerCase();
    const path = `${target.pathname}${target.search}`;
    if (host === BROKER_HOST) {
      if (!this.options.broker) return sendJson(res, 403, { code: 'BROKER_UNKNOWN_HANDLE', message: 'no credential broker is configured on this host' });
      // The target as sent, not as the URL parser normalised it: the broker refuses what it would guess at.
      const raw = transparent ? (req.url ?? '/') : (req.url ?? '').replace(/^[a-z][a-z0-9+.-]*:\/\/[^/?#]*/i, '') || '/';
      const caller = { sandboxId: client.sandboxId, handles: client.policy.handles, ...(client.tenantId === undefined ? {} : { tenantId: client.tenantId }) };
      // A broker request holds an upstream connection like any other (and pipelined ones add up).
      const release = this.claimUpstream(client, 'http', `${BROKER_HOST}:80`);
      if (typeof release !== 'function') {
        req.resume();
        return sendJson(res, 429, { code: release.code, message: release.message, rule: release.rule, destination: `${BROKER_HOST}:80` });
      }
      // Released when the answer is done or the connection goes (a queued pipelined answer never
      // closes on its own; the broker drops its upstream request when the connection goes too).
      res.once('close', release);
      req.socket.once('close', release);
      return this.options.broker.serve(caller, req, res, raw);
    }
    const port = Number(target.port || 80);
    const verdict = await this.decide(client, host, port, 'http');
    if (!verdict.ok) {
      req.resume();
      return sendJson(res, verdict.status, verdict.body);
    }
    const headers: Record<string, string | string[]> = {};
    for (const [name, value] of Object.entries(req.headers)) if (value !== undefined && !HOP_BY_HOP.has(name)) headers[name] = value;
    headers.host = target.host;
    const connectTimeoutMs = this.options.connectTimeoutMs ?? 10_000;
    const upstream = httpRequest({ host: verdict.address, port, method: req.method, path, headers, setHost: false, agent: false, timeout: connectTimeoutMs });
    upstream.once('close', verdict.release);
    const tunnel: TrackedConnection = { host, port, close: () => { upstream.destroy(); res.destroy(); } };
    client.tunnels.add(tunnel);
    // When the answer is done or the sandbox's connection goes (a pipelined request whose answer
    // is queued behind another never sees its own close), the upstream goes too.
    const gone = (): void => void upstream.destroy();
    req.socket.once('close', gone);
    upstream.once('close', () => req.socket.off('close', gone));
    res.once('close', () => {
      client.tunnels.delete(tunnel);
      upstream.destroy();
    });
    // Connecting has its own bound; once connected, the idle timeout applies (an upstream may
    // think for minutes before it answers, not for ever). While the request is upstream, that
    // timer guards it (bytes either way are activity there), so the sandbox gets a 502 rather
    // than a silent close from its own side's timer.
    req.socket.setTimeout(0);
    let connected = false;
    upstream.once('socket', (socket: Socket) => {
      const onConnect = (): void => {
        connected = true;
        upstream.setTimeout(this.timeouts.idleTimeoutMs);
      };
      if (socket.connecting) socket.once('connect', onConnect);
      else onConnect();
    });
    upstream.on('timeout', () => {
      upstream.destroy(new Error(connected ? `no bytes for ${this.timeouts.idleTimeoutMs} ms (the proxy's idle timeout)` : `no connection within ${connectTimeoutMs} ms`));
    });
    upstream.once('response', (response) => {
      const out: Record<string, string | string[]> = {};
      for (const [name, value] of Object.entries(response.headers)) if (value !== undefined && !HOP_BY_HOP.has(name)) out[name] = value;
      res.writeHead(response.statusCode ?? 502, out);
      response.pipe(res);
    });
    upstream.once('error', (error) => {
      if (res.headersSent) res.destroy();
      else sendJson(res, 502, { code: 'EGRESS_UPSTREAM_FAILED', message: `${host}:${port} failed: ${error.message}` });
    });
    req.pipe(upstream);
  }

  private async onConnect(req: IncomingMessage, socket: Duplex, head: Buffer): Promise<void> {
    socket.on('error', () => undefined);
    this.handshaken(socket);
    const client = this.clientOf(req.socket);
    const match = /^\[?([^\]]+?)\]?:(\d{1,5})$/.exec(req.url ?? '');
    if (!client || !match) {
      return endRaw(socket, 400, { code: 'EGRESS_BAD_REQUEST', message: client ? 'CONNECT wants host:port' : 'this address is not a Capsule sandbox' });
    }
    const host = (match[1] ?? '').toLowerCase();
    const port = Number(match[2]);
    if (host === BROKER_HOST) {
      return endRaw(socket, 400, { code: 'BROKER_BAD_REQUEST', message: 'use plain http://broker.capsule/<handle>/<path>; the broker adds TLS upstream' });
    }
    const verdict = await this.decide(client, host, port, 'connect');
    if (!verdict.ok) return endRaw(socket, verdict.status, verdict.body);
    this.tunnel(client, host, port, verdict, socket, head, 'HTTP/1.1 200 Connection Established\r\n\r\n');
  }

  private onTls(socket: Socket): void {
    const client = this.clientOf(socket);
    if (!client) return void socket.resetAndDestroy();
    // The handshake timer (from admit) bounds the wait for the ClientHello.
    let buffered = Buffer.alloc(0);
    const onData = (chunk: Buffer): void => {
      buffered = Buffer.concat([buffered, chunk]);
      const hello = parseClientHello(buffered);
      if (hello.kind === 'incomplete' && buffered.length < MAX_HELLO_BYTES) return;
      socket.off('data', onData);
      socket.pause();
      this.handshaken(socket);
      const name = hello.kind === 'hello' ? hello.serverName : undefined;
      if (!name) {
        this.report(client, 'blocked', 'tls', `${normalizeAddress(socket.localAddress ?? '')}:443`, {
          code: 'EGRESS_NOT_ALLOWED',
          rule: 'tls-needs-sni',
          message: 'a redirected TLS connection without a server name (SNI) is denied; connect by name or use the proxy (HTTPS_PROXY)',
        });
        return void socket.resetAndDestroy();
      }
      const port = this.options.transparentPorts?.tls ?? 443;
      void this.decide(client, name, port, 'tls').then(
        (verdict) => {
          if (!verdict.ok) return void socket.resetAndDestroy();
          this.tunnel(client, name, port, verdict, socket, buffered, undefined);
        },
        () => socket.resetAndDestroy(),
      );
    };
    socket.on('data', onData);
  }

  /** Opens a tunnel and tracks it, so that a policy change can close it. */
  private tunnel(client: Client, host: string, port: number, verdict: { address: string; release: () => void }, socket: Duplex, head: Buffer, greeting: string | undefined): void {
    const opened = openTunnel({
      address: verdict.address, port, socket, head, greeting,
      connectTimeoutMs: this.options.connectTimeoutMs ?? 10_000,
      idleTimeoutMs: this.timeouts.idleTimeoutMs,
      // Inside CONNECT, a ClientHello naming another server than the target (domain fronting
      // through an allowed host) must name an allowed one too; anything not TLS passes.
      admitHello: (hello) => {
        const name = hello.kind === 'hello' ? hello.serverName : undefined;
        const denial = name && name !== host ? client.policy.checkName(name, port) : undefined;
        if (!denial) return true;
        this.report(client, 'blocked', 'connect', `${name}:${port}`, {
          code: denial.code,
          rule: `tls-server-name:${denial.rule}`,
          message: `the TLS server name ${name} inside a tunnel to ${host}:${port} is not allowed: ${denial.message}`,
        });
        return false;
      },
    });
    const tracked: TrackedConnection = { host, port, close: () => opened.close() };
    client.tunnels.add(tracked);
    this.sockets.add(opened.upstream);
    opened.upstream.once('close', () => {
      this.sockets.delete(opened.upstream);
      client.tunnels.delete(tracked);
      verdict.release();
    });
  }
}
