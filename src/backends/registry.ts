import type { HostEnvironment } from '../host/host-env.host.js';
import type { Backend } from './backend.js';
import { egressNetworkProvider } from './gvisor/egress-provider.js';
import { GvisorBackend, type GvisorBackendOptions } from './gvisor/gvisor-backend.host.js';
import { NamespaceBackend, type NamespaceBackendOptions } from './namespace/namespace-backend.host.js';

export interface BackendRegistryOptions {
  /** Options of the namespace backend beyond the host (the operator's egress network). */
  namespace?: Omit<NamespaceBackendOptions, 'host'>;
  /**
   * Options of the gvisor backend beyond the host (debug logs, network namespaces). Its network
   * defaults to the namespace backend's EgressNetwork when one is given.
   */
  gvisor?: Omit<GvisorBackendOptions, 'host'>;
}

/**
 * Every isolation backend Capsule has, on one prepared host. Each reports through `probe()`
 * whether it is available here and what it enforces; callers refuse specs it cannot honour.
 */
export function createBackends(host: HostEnvironment, options: BackendRegistryOptions = {}): Backend[] {
  // One egress network for both backends: gVisor sandboxes join the same namespaces and proxy.
  const shared = options.namespace?.network;
  const gvisorNetwork = shared ? { network: egressNetworkProvider(shared) } : {};
  return [new NamespaceBackend({ host, ...options.namespace }), new GvisorBackend({ host, ...gvisorNetwork, ...options.gvisor })];
}
