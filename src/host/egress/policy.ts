import { BlockList } from 'node:net';
import type { NetworkPolicy } from '../../sandbox-spec/index.js';
import { addressFamily, normalizeAddress, parseCidr } from './addresses.js';
import { embeddedIpv4 } from './embedded-ipv4.js';

/** Stable codes a denial carries in the proxy's JSON body, in logs and in events. */
export type DenyCode =
  | 'EGRESS_NETWORK_DISABLED'
  | 'EGRESS_NOT_ALLOWED'
  | 'EGRESS_OPERATOR_DENY'
  | 'EGRESS_FORBIDDEN_ADDRESS'
  | 'EGRESS_LIMIT';

export interface Denial {
  code: DenyCode;
  /** The rule that decided, e.g. `allowlist`, `operator-deny:evil.example`, `always-deny:loopback`. */
  rule: string;
  message: string;
}

interface DomainRule {
  entry: string;
  /** Lower-case name without the `*.`. */
  name: string;
  wildcard: boolean;
  port: number | undefined;
}

interface CidrRule {
  entry: string;
  list: BlockList;
}

/**
 * A parsed list of domain and CIDR entries (an allowlist or the operator's deny list). With
 * `coversSubdomains` (deny lists) `evil.example` also matches `a.evil.example`.
 */
export class DestinationList {
  private readonly domains: DomainRule[] = [];
  private readonly cidrs: CidrRule[] = [];
  private readonly coversSubdomains: boolean;

  constructor(entries: readonly string[], options: { coversSubdomains?: boolean } = {}) {
    this.coversSubdomains = options.coversSubdomains ?? false;
    for (const raw of entries) {
      const entry = raw.trim().toLowerCase();
      const cidr = parseCidr(entry);
      if (cidr) {
        const list = new BlockList();
        list.addSubnet(cidr.address, cidr.prefix, cidr.type);
        this.cidrs.push({ entry, list });
        continue;
      }
      const match = /^(\*\.)?([a-z0-9.-]+?)(?::(\d{1,5}))?$/.exec(entry);
      if (!match) continue; // the spec schema refuses these; an operator typo matches nothing
      this.domains.push({
        entry,
        name: match[2] ?? '',
        wildcard: match[1] !== undefined,
        port: match[3] === undefined ? undefined : Number(match[3]),
      });
    }
  }

  /** The entry that names `host` (a lower-case domain), on `port` when given. */
  matchName(host: string, port?: number): string | undefined {
    for (const rule of this.domains) {
      if (port !== undefined && rule.port !== undefined && rule.port !== port) continue;
      const hit = rule.wildcard || this.coversSubdomains ? host.endsWith(`.${rule.name}`) || (!rule.wildcard && host === rule.name) : host === rule.name;
      if (hit) return rule.entry;
    }
    return undefined;
  }

  /** The CIDR entry that contains `address`. */
  matchAddress(address: string): string | undefined {
    const ip = normalizeAddress(address);
    const type = addressFamily(ip);
    if (!type) return undefined;
    return this.cidrs.find((rule) => rule.list.check(ip, type))?.entry;
  }

  /**
   * As matchAddress, and also for the IPv4 address an IPv6 one carries (NAT64, 6to4, Teredo, …):
   * a deny entry `203.0.113.0/24` also denies `64:ff9b::203.0.113.5`.
   */
  matchAddressOrCarried(address: string): string | undefined {
    return this.matchAddress(address) ?? embeddedIpv4(address).map(({ ipv4 }) => this.matchAddress(ipv4)).find((entry) => entry !== undefined);
  }
}

/**
 * One sandbox's network policy, compiled for the proxy. Names are decided before anything is
 * resolved (a name outside the policy never reaches a resolver, so it cannot leak through DNS);
 * addresses are decided after resolution (so a name resolving to a private address is denied).
 */
export class CompiledPolicy {
  readonly mode: NetworkPolicy['mode'];
  readonly handles: ReadonlySet<string>;
  readonly maxConnections: number;
  readonly maxConcurrentConnections: number;
  private readonly allow: DestinationList;
  private readonly deny: DestinationList;

  constructor(policy: NetworkPolicy, operatorDeny: DestinationList) {
    this.mode = policy.mode;
    this.allow = new DestinationList(policy.allow);
    this.deny = operatorDeny;
    this.handles = new Set(policy.handles);
    this.maxConnections = policy.maxConnections;
    this.maxConcurrentConnections = policy.maxConcurrentConnections;
  }

  /** Decides a destination as the client named it (a domain or an address literal). */
  checkName(host: string, port: number): Denial | undefined {
    const name = host.toLowerCase();
    const destination = `${name}:${port}`;
    if (this.mode === 'none') {
      return { code: 'EGRESS_NETWORK_DISABLED', rule: 'mode:none', message: `${destination} denied: this sandbox's network policy is "none"` };
    }
    const literal = addressFamily(normalizeAddress(name)) !== undefined;
    const denied = literal ? this.deny.matchAddressOrCarried(name) : this.deny.matchName(name, port);
    if (denied) {
      return { code: 'EGRESS_OPERATOR_DENY', rule: `operator-deny:${denied}`, message: `${destination} denied by the operator's deny list (${denied})` };
    }
    if (this.mode === 'internet') return undefined;
    const allowed = literal ? this.allow.matchAddress(name) : this.allow.matchName(name, port);
    if (allowed) return undefined;
    return {
      code: 'EGRESS_NOT_ALLOWED',
      rule: 'allowlist',
      message: `${destination} is not in this sandbox's allowlist; add it to network.allow (e.g. "${literal ? `${name}/32` : `${name}:${port}`}")`,
    };
  }

  /** Decides the resolved address (after checkName allowed the name). */
  checkAddress(host: string, address: string, port: number, forbidden: { match(address: string): string | undefined }): Denial | undefined {
    const rule = forbidden.match(address);
    if (rule) {
      const via = host === address ? '' : ` (${host} resolves to it)`;
      return {
        code: 'EGRESS_FORBIDDEN_ADDRESS',
        rule: `always-deny:${rule}`,
        message: `${address}:${port}${via} denied: ${rule} addresses are never reachable from a sandbox`,
      };
    }
    const denied = this.deny.matchAddressOrCarried(address);
    if (denied) {
      return { code: 'EGRESS_OPERATOR_DENY', rule: `operator-deny:${denied}`, message: `${address}:${port} (${host}) denied by the operator's deny list (${denied})` };
    }
    return undefined;
  }

  /** Whether the resolver should answer `name` at all (any port). */
  isNameResolvable(name: string): boolean {
    if (this.mode === 'none' || this.deny.matchName(name)) return false;
    return this.mode === 'internet' || this.allow.matchName(name) !== undefined;
  }
}
