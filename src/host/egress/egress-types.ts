import type { ForbiddenAddresses } from './addresses.js';
import type { CredentialBroker } from './broker.js';
import type { EgressTimeouts } from './connection-limits.js';
import type { DenyCode } from './policy.js';

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

/** A log line about denied egress: the first denial of a kind, or a sum of its repeats. */
export interface EgressLogEntry extends EgressEvent {
  /** On a summary: how many more denials of this kind the window held. */
  repeated?: number;
  /** On a summary: the window, in milliseconds. */
  windowMs?: number;
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
  /** ... because the proxy held its descriptor budget across all sandboxes, or could not record the sandbox's connection bound. */
  capacityLimitHits: number;
  /** Connections of the sandbox the proxy holds open now (its side and upstream). */
  openConnections: number;
  /** The proxy's descriptor budget for all sandboxes. */
  capacity: number;
}

/** The egress part of a sandbox's counters (backends' SandboxCounters). */
export interface EgressCounters {
  /** Outbound attempts the egress proxy denied (sandboxes with a network only). */
  egressBlocked?: number;
  /** Outbound attempts refused by an egress limit (any of the causes below, or `network.maxConnections`). */
  egressLimitHits?: number;
  /** ... of them, because the sandbox held `network.maxConcurrentConnections` open connections. */
  egressConcurrencyHits?: number;
  /** ... of them, because the egress proxy held its descriptor budget for all sandboxes. */
  egressCapacityHits?: number;
  /** The egress proxy's descriptor budget for all sandboxes (what a capacity hit ran into). */
  egressCapacity?: number;
}

/** The egress part of a sandbox's counters, from the proxy's stats. */
export function egressCounters(stats: EgressStats): EgressCounters {
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
  /**
   * Called, synchronously, before a sandbox's lifetime connection count (`network.maxConnections`)
   * passes the last number recorded: `upTo` is the new bound to record. The proxy counts on to
   * it, so a new process that registers the sandbox with that bound (`register(..., { connections
   * })`) after a crash starts at or above the true count: never looser. When it throws (a full
   * data disk) the connection is refused (503, `EGRESS_LIMIT`, rule `connection-record`) and
   * nothing is counted. @default nothing recorded
   */
  recordConnections?: (sandboxId: string, upTo: number) => void;
}
