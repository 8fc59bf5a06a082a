import { isIP } from 'node:net';
import { SandboxError } from '../../errors/index.js';
import type { NetworkPolicyInput } from '../../sandbox-spec/index.js';

/** Every IPv4 (and IPv6) destination: E2B's way of writing "deny all" in `denyOut`. */
const ALL_TRAFFIC = new Set(['0.0.0.0/0', '::/0']);

function refused(field: string, why: string, hint: string): SandboxError {
  return new SandboxError('INVALID_ARGUMENT', `${field} cannot be honoured by Capsule's E2B facade: ${why}`, { details: { field }, hint });
}

/**
 * Capsule's network policy for E2B's `network` create option, or undefined for none (Capsule's
 * default: loopback only). What Capsule cannot enforce exactly is refused, never approximated: a
 * per-sandbox deny list other than "everything", transform rules, public traffic without a
 * token. The operator's maxima and deny list still apply at create. Pure.
 *
 * `allow_internet_access` is not mapped: E2B's SDK 2.45 sends `true` when the caller said
 * nothing, so it cannot open the internet; `getInfo()` reports `allowInternetAccess: false`.
 */
export function e2bNetworkPolicy(network: unknown): NetworkPolicyInput | undefined {
  if (network !== undefined && network !== null) {
    if (typeof network !== 'object' || Array.isArray(network)) throw refused('network', 'it must be an object', 'Pass network: { allowOut, denyOut }.');
    const { allowOut, denyOut, allowPublicTraffic, ...rest } = network as Record<string, unknown>;
    const unknownKeys = Object.keys(rest);
    if (unknownKeys.length > 0) {
      throw refused(`network.${unknownKeys[0]}`, 'only allowOut, denyOut and allowPublicTraffic are implemented', 'Remove the option; docs/e2b-compatibility.md lists what is supported.');
    }
    if (allowPublicTraffic === true) {
      throw refused('network.allowPublicTraffic', 'ports are reached with the sandbox\'s traffic access token (E2b-Traffic-Access-Token)', 'Omit it (or set false) and send the token; or create the sandbox through /v1 with network.publicPorts.');
    }
    const allow = strings('network.allowOut', allowOut);
    const deny = strings('network.denyOut', denyOut);
    const denyAll = deny.length > 0 && deny.every((entry) => ALL_TRAFFIC.has(entry));
    if (deny.length > 0 && !denyAll) {
      throw refused('network.denyOut', 'a sandbox has an allow list, not a deny list of its own (the operator\'s deny list applies to all)', 'List what the sandbox may reach in allowOut with denyOut: ["0.0.0.0/0"].');
    }
    if (allow.length > 0) return { mode: 'allowlist', allow: allow.map(asAllowEntry) };
  }
  return undefined;
}

function strings(field: string, value: unknown): string[] {
  if (value === undefined || value === null) return [];
  if (!Array.isArray(value) || value.some((entry) => typeof entry !== 'string')) throw refused(field, 'it must be a list of strings', 'Pass destinations such as "example.com", "*.example.com" or "8.8.8.8/32".');
  return value as string[];
}

/** A bare address is a one-address CIDR, as E2B reads it. */
function asAllowEntry(entry: string): string {
  const version = isIP(entry);
  return version === 4 ? `${entry}/32` : version === 6 ? `${entry}/128` : entry;
}
