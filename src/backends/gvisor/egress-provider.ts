import type { EgressNetwork, NetworkAttachment as EgressAttachment } from '../../host/netns-network.host.js';
import type { SandboxSpec } from '../../sandbox-spec/index.js';
import type { Capability } from '../backend.js';
import type { NetworkAttachment } from './gvisor-sandbox.host.js';
import type { NetworkNamespaceProvider } from './gvisor-backend.host.js';

/**
 * The gvisor backend's network seam over the instance's one EgressNetwork (the namespace
 * backend's): the same netns pool, host rules, egress proxy, resolver and broker. runsc runs
 * inside the attached namespace with `--network=sandbox`. See docs/decisions/004-gvisor.md.
 */
export function egressNetworkProvider(network: EgressNetwork): NetworkNamespaceProvider {
  const capabilities: readonly Capability[] = ['network.allowlist', 'network.internet'];
  return {
    capabilities,
    async acquire(id: string, spec: SandboxSpec, tenantId?: string): Promise<NetworkAttachment> {
      const attached = await network.attach(id, spec.network, tenantId).catch(async (error: unknown) => {
        await network.detach(id).catch(() => undefined);
        throw error;
      });
      return attachment(id, attached);
    },
    async reattach(id: string, spec: SandboxSpec, tenantId?: string): Promise<NetworkAttachment> {
      return attachment(id, await network.reattach(id, spec.network, tenantId));
    },
  };

  function attachment(id: string, attached: EgressAttachment): NetworkAttachment {
    return {
      path: attached.netnsPath,
      resolvConf: attached.resolvConf,
      env: attached.env,
      setPolicy: (policy) => network.setPolicy(id, policy),
      stats: () => network.stats(id),
      release: () => network.detach(id),
      letGo: () => network.letGo(id),
    };
  }
}
