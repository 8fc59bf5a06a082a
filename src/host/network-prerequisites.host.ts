import { constants } from 'node:fs';
import { access } from 'node:fs/promises';

/**
 * Host tools sandbox networks need; undefined when present, else what is missing. A module of its
 * own: a backend asks it without loading the egress network (netns-network.host.ts), which only
 * a networked sandbox needs.
 */
export async function networkPrerequisitesProblem(): Promise<string | undefined> {
  for (const tool of ['/usr/sbin/ip', '/usr/sbin/nft', '/usr/bin/nsenter']) {
    try {
      await access(tool, constants.X_OK);
    } catch {
      return `${tool} is missing (install iproute2, nftables and util-linux)`;
    }
  }
  return undefined;
}
