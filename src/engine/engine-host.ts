import type { Backend } from '../backends/backend.js';
import { createBackends } from '../backends/registry.js';
import type { EgressEvent } from '../host/egress/egress-proxy.js';
import type { EgressTimeouts } from '../host/egress/connection-limits.js';
import type { EgressLogEntry } from '../host/egress/denial-log.js';
import type { CredentialBroker } from '../host/egress/broker.js';
import { HostEnvironment } from '../host/host-env.host.js';
import { EgressNetwork } from '../host/netns-network.host.js';
import { InstanceLock } from '../host/lock.host.js';

export { loadTokenKey, tokenKeyPath } from '../host/token-key.host.js';

export type { EgressEvent } from '../host/egress/egress-proxy.js';
export type { EgressLogEntry } from '../host/egress/denial-log.js';

/** The operator's egress settings for sandboxes with a network (docs/api.md, decision 003). */
export interface EgressOptions {
  /** Domains (with their subdomains) and CIDRs no sandbox may reach, whatever its allow list. */
  operatorDeny?: readonly string[];
  /** Tests only: resolve names from this map and nothing else (no query leaves the machine). */
  hosts?: Readonly<Record<string, readonly string[]>>;
  /** Where denied attempts are logged (repeats summed). @default a JSON line on stderr */
  log?: (entry: EgressLogEntry) => void;
  /** Every denied or limited attempt (metrics). */
  onEvent?: (event: EgressEvent) => void;
  /** Handshake and idle timeouts of proxied connections. @default 10 s, 5 min */
  timeouts?: Partial<EgressTimeouts>;
  /** Descriptors kept for the API: the proxy holds at most RLIMIT_NOFILE minus this. */
  descriptorReserve?: number;
  /** The operator maximum of a sandbox's concurrent connections (the kernel backstop's base). */
  maxConcurrentConnections?: number;
}

export interface EngineHostOptions {
  /** Capsule's data directory (workspaces, cgroup names, state). */
  dataDir: string;
  /** The prepared host the backends run on. @default one on `dataDir` */
  host?: HostEnvironment;
  /** Size of the workspace volume's image when it is first made; ignored when `host` is given. @default 32 GiB */
  volumeBytes?: number;
  /** Backends by name. @default every backend of the registry on the host */
  backends?: Backend[];
  /** Networking of the default backends; ignored when `backends` is given. */
  egress?: EgressOptions;
  /**
   * Sandboxes of both backends are held by supervisors that outlive the server
   * (NamespaceBackendOptions.supervise, GvisorBackendOptions.supervise); ignored when `backends`
   * is given. @default false
   */
  supervise?: boolean;
}

/**
 * The host and backends an engine runs on: given ones (tests), or the registry's on a prepared
 * host with one egress network shared by both backends. The server never builds these itself.
 */
export function openEngineHost(options: EngineHostOptions): { host: HostEnvironment; backends: Backend[]; broker?: CredentialBroker } {
  const host = options.host ?? new HostEnvironment({ dataDir: options.dataDir, volumeBytes: options.volumeBytes });
  if (options.backends) return { host, backends: options.backends };
  const egress = options.egress;
  const supervise = options.supervise === true ? { supervise: true } : {};
  if (!egress) return { host, backends: createBackends(host, { namespace: supervise, gvisor: supervise }) };
  const network = new EgressNetwork({
    host,
    operatorDeny: egress.operatorDeny,
    ...(egress.hosts ? { hosts: egress.hosts, hostsOnly: true } : {}),
    ...(egress.log ? { log: egress.log } : {}),
    ...(egress.timeouts ? { timeouts: egress.timeouts } : {}),
    ...(egress.descriptorReserve !== undefined ? { descriptorReserve: egress.descriptorReserve } : {}),
    ...(egress.maxConcurrentConnections !== undefined ? { maxConcurrentConnections: egress.maxConcurrentConnections } : {}),
  });
  if (egress.onEvent) network.proxy.onEvent(egress.onEvent);
  // The broker the proxy serves is the one whose grants the engine checks at create.
  return { host, backends: createBackends(host, { namespace: { network, ...supervise }, gvisor: supervise }), broker: network.broker };
}

/**
 * One engine per data directory: a second one would reconcile away the first one's sandboxes.
 * Taken before anything in the directory is opened; HOST_NOT_READY names the live owner.
 */
export function lockDataDir(dataDir: string): { release(): void } {
  return InstanceLock.acquire(dataDir);
}
