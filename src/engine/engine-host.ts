import type { Backend } from '../backends/backend.js';
import { createBackends } from '../backends/registry.js';
import type { EgressEvent } from '../host/egress/egress-proxy.js';
import { HostEnvironment } from '../host/host-env.host.js';
import { EgressNetwork } from '../host/netns-network.host.js';
import { InstanceLock } from '../host/lock.host.js';

export type { EgressEvent } from '../host/egress/egress-proxy.js';

/** The operator's egress settings for sandboxes with a network (docs/api.md, decision 003). */
export interface EgressOptions {
  /** Domains (with their subdomains) and CIDRs no sandbox may reach, whatever its allow list. */
  operatorDeny?: readonly string[];
  /** Tests only: resolve names from this map and nothing else (no query leaves the machine). */
  hosts?: Readonly<Record<string, readonly string[]>>;
  /** Where denied attempts are logged. @default a JSON line on stderr */
  log?: (event: EgressEvent) => void;
  /** Every denied or limited attempt (metrics). */
  onEvent?: (event: EgressEvent) => void;
}

export interface EngineHostOptions {
  /** Capsule's data directory (workspaces, cgroup names, state). */
  dataDir: string;
  /** The prepared host the backends run on. @default one on `dataDir` */
  host?: HostEnvironment;
  /** Backends by name. @default every backend of the registry on the host */
  backends?: Backend[];
  /** Networking of the default backends; ignored when `backends` is given. */
  egress?: EgressOptions;
}

/**
 * The host and backends an engine runs on: given ones (tests), or the registry's on a prepared
 * host with one egress network shared by both backends. The server never builds these itself.
 */
export function openEngineHost(options: EngineHostOptions): { host: HostEnvironment; backends: Backend[] } {
  const host = options.host ?? new HostEnvironment({ dataDir: options.dataDir });
  if (options.backends) return { host, backends: options.backends };
  const egress = options.egress;
  if (!egress) return { host, backends: createBackends(host) };
  const network = new EgressNetwork({
    host,
    operatorDeny: egress.operatorDeny,
    ...(egress.hosts ? { hosts: egress.hosts, hostsOnly: true } : {}),
    ...(egress.log ? { log: egress.log } : {}),
  });
  if (egress.onEvent) network.proxy.onEvent(egress.onEvent);
  return { host, backends: createBackends(host, { namespace: { network } }) };
}

/**
 * One engine per data directory: a second one would reconcile away the first one's sandboxes.
 * Taken before anything in the directory is opened; HOST_NOT_READY names the live owner.
 */
export function lockDataDir(dataDir: string): { release(): void } {
  return InstanceLock.acquire(dataDir);
}
