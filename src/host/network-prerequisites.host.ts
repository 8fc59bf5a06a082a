import { constants } from 'node:fs';
import { access } from 'node:fs/promises';

/**
 * Host tools sandbox networks need; undefined when present, else what is missing. A module of its
 * own: a backend asks it without loading the egress network (netns-network.host.ts), which only
 * a networked sandbox needs.
 */
export async function networkPrerequisitesProblem(): Promise<string | undefined> {
  // Asked on every create (a backend's probe): tools found stay believed for a while; a missing
  // one is looked for again each time, so installing it takes effect at once.
  if (foundAtMs !== undefined && Date.now() - foundAtMs < FOUND_FOR_MS) return undefined;
  for (const tool of ['/usr/sbin/ip', '/usr/sbin/nft', '/usr/bin/nsenter']) {
    try {
      await access(tool, constants.X_OK);
    } catch {
      foundAtMs = undefined;
      return `${tool} is missing (install iproute2, nftables and util-linux)`;
    }
  }
  foundAtMs = Date.now();
  return undefined;
}

/** How long tools found are believed before they are looked for again. */
const FOUND_FOR_MS = 10_000;
let foundAtMs: number | undefined;
