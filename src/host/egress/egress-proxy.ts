import { createServer as createHttpServer, type IncomingMessage, type Server as HttpServer, type ServerResponse } from 'node:http';
import { createServer as createNetServer, type AddressInfo, type Server as NetServer, type Socket } from 'node:net';
import { endRaw, openTunnel, sendJson } from './tunnel.js';
import { lookup } from 'node:dns/promises';
import type { Duplex } from 'node:stream';
import type { NetworkPolicy } from '../../sandbox-spec/index.js';
import { BROKER_HOST } from './broker.js';
import { addressFamily, ForbiddenAddresses, normalizeAddress } from './addresses.js';
import { DnsResponder, type DnsQuestion } from './dns.js';
import { CompiledPolicy, DestinationList, type Denial } from './policy.js';
import { parseClientHello } from './sni.js';
import { DenialLog } from './denial-log.js';
import { CAPACITY_RULE, CONCURRENCY_RULE, ConnectionLimits, DEFAULT_EGRESS_TIMEOUTS, RECORD_RULE } from './connection-limits.js';
import { forwardHttp } from './forward-http.js';
import { DEFAULT_EGRESS_PORTS, type EgressEvent, type EgressPorts, type EgressProtocol, type EgressProxyOptions, type EgressStats } from './egress-types.js';

export { DEFAULT_EGRESS_PORTS, egressCounters } from './egress-types.js';
export { CAPACITY_RULE, CONCURRENCY_RULE, RECORD_RULE } from './connection-limits.js';
export type { EgressEvent, EgressPorts, EgressProtocol, EgressProxyOptions, EgressStats } from './egress-types.js';

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
  /** Connections counted up to this number are recorded (EgressProxyOptions.recordConnections). */
  recordedUpTo: number;
}

/**
 * How many connections one record covers: a 64th of the sandbox's budget (1 to 256), so a crash
 * costs it at most that share and the record is written once per that many connections.
 */
export function connectionRecordStep(maxConnections: number): number {
  return Math.max(1, Math.min(256, Math.floor(maxConnections / 64)));
}

/** A connection refused because its sandbox's connection bound could not be recorded (the server's fault, not the sandbox's). */
function recordDenial(error: unknown): Denial {
  const code = (error as NodeJS.ErrnoException).code;
  const why = code === 'ENOSPC' || code === 'EDQUOT' ? 'the data disk is full' : (error as Error).message;
  return {
    code: 'EGRESS_LIMIT',
    rule: RECORD_RULE,
    message: `the egress proxy cannot record this sandbox's connection count (${why}), so it opens no more connections for it; retry later, and ask the operator to free space on the data disk`,
  };
}

/** An allowed connection holds an upstream slot until `release` (called once, when it closes). */
type Verdict =
  | { ok: true; address: string; release: () => void }
  | { ok: false; status: number; body: { code: string; message: string; rule?: string; destination?: string } };

const MAX_HELLO_BYTES = 20_000; // as tunnel.ts: a ClientHello is far smaller

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
  private readonly limits: ConnectionLimits;

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
    this.limits = new ConnectionLimits({ timeouts: { ...DEFAULT_EGRESS_TIMEOUTS, ...options.timeouts }, maxDescriptors: options.maxDescriptors });
    const { handshakeTimeoutMs, idleTimeoutMs } = this.limits.timeouts;
    const httpOptions = { headersTimeout: handshakeTimeoutMs, requestTimeout: 0, keepAliveTimeout: Math.min(5000, idleTimeoutMs) };
    this.proxyServer = createHttpServer(httpOptions, (req, res) => void this.onRequest(req, res, false).catch(guard(res)));
    this.proxyServer.on('connect', (req: IncomingMessage, socket: Duplex, head: Buffer) => void this.onConnect(req, socket, head).catch(guard(socket)));
    this.httpServer = createHttpServer(httpOptions, (req, res) => void this.onRequest(req, res, true).catch(guard(res)));
    this.tlsServer = createNetServer();
    for (const [server, protocol] of [[this.proxyServer, 'http'], [this.httpServer, 'http'], [this.tlsServer, 'tls']] as const) {
      // A sandbox that stops talking mid-request is closed after the idle timeout.
      if (server !== this.tlsServer) (server as HttpServer).timeout = idleTimeoutMs;
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

  /**
   * Starts serving a sandbox whose veth address is `address`; `tenantId` is what the broker grants
   * by. `counted.connections`: connections a previous process counted for it (its recorded bound).
   */
  register(sandboxId: string, address: string, policy: NetworkPolicy, tenantId?: string, counted: { connections?: number } = {}): void {
    const connections = counted.connections ?? 0;
    const client: Client = {
      sandboxId,
      tenantId,
      address,
      policy: new CompiledPolicy(policy, this.operatorDeny),
      recordedUpTo: connections,
      stats: { connections, blocked: 0, limitHits: 0, lifetimeLimitHits: 0, concurrencyLimitHits: 0, capacityLimitHits: 0, openConnections: 0, capacity: this.limits.capacity },
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
    return this.limits.descriptorUse();
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
      else if (denial.rule === CAPACITY_RULE || denial.rule === RECORD_RULE) client.stats.capacityLimitHits += 1;
      else client.stats.lifetimeLimitHits += 1;
    }
    const event: EgressEvent = { sandboxId: client.sandboxId, kind, protocol, destination, code: denial.code, rule: denial.rule, message: denial.message };
    this.denials.record(event);
    for (const listener of this.listeners) listener(event);
  }

  /**
   * Takes a sandbox-side connection in, or refuses it at once with a reset, counted as an egress
   * limit, when the sandbox holds its `maxConcurrentConnections` or the proxy its descriptor budget.
   */
  private admit(socket: Socket, protocol: EgressProtocol): boolean {
    socket.on('error', () => undefined);
    const client = this.clientOf(socket);
    const refused = this.limits.admit(socket, client);
    if (refused) {
      if (client) this.report(client, 'limited', protocol, `${normalizeAddress(socket.localAddress ?? '')}:${socket.localPort ?? 0}`, refused);
      socket.resetAndDestroy();
      return false;
    }
    this.sockets.add(socket);
    socket.once('close', () => this.sockets.delete(socket));
    return true;
  }

  /** An upstream slot for an allowed connection: its release, or the refusal (reported). */
  private claimUpstream(client: Client, protocol: EgressProtocol, destination: string): (() => void) | Denial {
    const claimed = this.limits.claimUpstream(client);
    if (typeof claimed !== 'function') this.report(client, 'limited', protocol, destination, claimed);
    return claimed;
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
    if (client.stats.connections + 1 > client.recordedUpTo && this.options.recordConnections) {
      const upTo = client.stats.connections + connectionRecordStep(client.policy.maxConnections);
      // Recorded before it is counted on: a bound that could not be written (a full data disk)
      // refuses the connection rather than let a restart count from a lower one.
      try {
        this.options.recordConnections(client.sandboxId, upTo);
      } catch (error) {
        release();
        const denial = recordDenial(error);
        this.report(client, 'limited', protocol, destination, denial);
        return { ok: false, status: 503, body: { code: denial.code, message: denial.message, rule: denial.rule, destination } };
      }
      client.recordedUpTo = upTo;
    }
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
    this.limits.handshaken(req.socket);
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
    if (req.socket.destroyed) return verdict.release(); // the sandbox left while the name resolved
    forwardHttp({
      req, res, host, port, hostHeader: target.host, path, address: verdict.address,
      connectTimeoutMs: this.options.connectTimeoutMs ?? 10_000,
      idleTimeoutMs: this.limits.timeouts.idleTimeoutMs,
      release: verdict.release,
      track: (close) => {
        const tracked: TrackedConnection = { host, port, close };
        client.tunnels.add(tracked);
        return () => client.tunnels.delete(tracked);
      },
    });
  }

  private async onConnect(req: IncomingMessage, socket: Duplex, head: Buffer): Promise<void> {
    socket.on('error', () => undefined);
    this.limits.handshaken(req.socket); // the same socket, handed over by the HTTP server
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
      this.limits.handshaken(socket);
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
    if (socket.destroyed) return verdict.release(); // the sandbox left while the name resolved
    const opened = openTunnel({
      address: verdict.address, port, socket, head, greeting,
      connectTimeoutMs: this.options.connectTimeoutMs ?? 10_000,
      idleTimeoutMs: this.limits.timeouts.idleTimeoutMs,
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
