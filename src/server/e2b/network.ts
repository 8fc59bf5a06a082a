import { isIP } from 'node:net';
import { SandboxError } from '../../errors/index.js';
import type { NetworkPolicyInput } from '../../sandbox-spec/index.js';

/** Every IPv4 (and IPv6) destination: E2B's way of writing "deny all" in `denyOut`. */
const ALL_TRAFFIC = new Set(['0.0.0.0/0', '::/0']);

function refused(field: string, why: string, hint: string): SandboxError {
  return new SandboxError('INVALID_ARGUMENT', `${field} cannot be honoured by Capsule's E2B facade: ${why}`, { details: { field }, hint });
}

/**
 * Capsule's network policy for E2B's `network` option and `allow_internet_access`, or undefined
 * for none (Capsule's default: loopback only). What Capsule cannot enforce exactly is refused,
 * never approximated: a per-sandbox deny list other than "everything", transform rules, an egress
 * proxy, public traffic without a token. The operator's maxima and deny list still apply. Pure.
 *
 * `internet` is `allow_internet_access` where the caller said it: E2B's SDK 2.51 sends it only
 * when set (`/v2/sandboxes`, and every network update); 2.45 (`/sandboxes`) sends `true` when the
 * caller said nothing, so there only `false` is passed and `true` opens nothing. As in E2B:
 * `false` is `denyOut: ["0.0.0.0/0"]`; `allowOut` entries pass a deny-all; with internet access
 * and no deny-all, everything is reachable (Capsule's `internet` mode: public addresses only).
 */
export function e2bNetworkPolicy(network: unknown, internet?: boolean): NetworkPolicyInput | undefined {
  let allow: string[] = [];
  let denyAll = false;
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
    allow = strings('network.allowOut', allowOut);
    const deny = strings('network.denyOut', denyOut);
    denyAll = deny.length > 0 && deny.every((entry) => ALL_TRAFFIC.has(entry));
    if (deny.length > 0 && !denyAll) {
      throw refused('network.denyOut', 'a sandbox has an allow list, not a deny list of its own (the operator\'s deny list applies to all)', 'List what the sandbox may reach in allowOut with denyOut: ["0.0.0.0/0"].');
    }
  }
  if (internet === true && !denyAll) return { mode: 'internet' };
  if (allow.length > 0) return { mode: 'allowlist', allow: allow.map(asAllowEntry) };
  // Closed on purpose (E2B's way to open a sandbox later with updateNetwork): a network that
  // reaches nothing, which an update can open; nothing said is Capsule's default, no network.
  if (internet === false || denyAll) return { mode: 'allowlist', allow: [] };
  return undefined;
}

/**
 * The policy of an E2B network update (`PUT /sandboxes/{id}/network`): as at create, with what it
 * omits cleared (E2B's rule), so an update that opens nothing leaves a sandbox that reaches
 * nothing. That is an empty allow list, not `none`, so that a later update can open it again.
 */
export function e2bNetworkUpdate(body: Record<string, unknown>): NetworkPolicyInput {
  const { allow_internet_access: internet, ...network } = body;
  if (internet !== undefined && typeof internet !== 'boolean') throw refused('allow_internet_access', 'it must be true or false', 'Pass allowInternetAccess: true or false.');
  return e2bNetworkPolicy(network, internet) ?? { mode: 'allowlist', allow: [] };
}

/** A sandbox's policy as E2B's `getInfo()` reads it: `allowInternetAccess` and `network`. */
export function e2bNetworkInfo(policy: { mode: string; allow: readonly string[] }): { allowInternetAccess: boolean; network?: { allowOut?: string[]; denyOut?: string[] } } {
  if (policy.mode === 'internet') return { allowInternetAccess: true };
  if (policy.mode === 'allowlist' && policy.allow.length > 0) return { allowInternetAccess: false, network: { allowOut: [...policy.allow], denyOut: ['0.0.0.0/0'] } };
  return { allowInternetAccess: false, network: { denyOut: ['0.0.0.0/0'] } };
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
