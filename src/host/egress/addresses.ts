import { BlockList, isIP } from 'node:net';
import { networkInterfaces } from 'node:os';
import { embeddedIpv4, isAmbiguousLocalNat64 } from './embedded-ipv4.js';

/** One always-denied range, with the name a denial reports. */
interface NamedRange {
  rule: string;
  list: BlockList;
}

/**
 * Ranges a sandbox never reaches, whatever its policy says: loopback, RFC 1918, CGNAT, link-local
 * (with the metadata address), multicast and reserved space, and IPv6 loopback, ULA, link-local
 * and multicast. Checked on the address the proxy actually connects to, after resolution.
 */
const ALWAYS_DENIED: readonly [string, string, number, 'ipv4' | 'ipv6'][] = [
  ['this-network', '0.0.0.0', 8, 'ipv4'],
  ['private-10', '10.0.0.0', 8, 'ipv4'],
  ['cgnat', '100.64.0.0', 10, 'ipv4'],
  ['loopback', '127.0.0.0', 8, 'ipv4'],
  ['link-local (cloud metadata)', '169.254.0.0', 16, 'ipv4'],
  ['private-172', '172.16.0.0', 12, 'ipv4'],
  ['ietf-protocol', '192.0.0.0', 24, 'ipv4'],
  ['private-192', '192.168.0.0', 16, 'ipv4'],
  ['benchmarking', '198.18.0.0', 15, 'ipv4'],
  ['multicast', '224.0.0.0', 4, 'ipv4'],
  ['reserved', '240.0.0.0', 4, 'ipv4'],
  ['unspecified-v6', '::', 128, 'ipv6'],
  ['loopback-v6', '::1', 128, 'ipv6'],
  ['unique-local-v6', 'fc00::', 7, 'ipv6'],
  ['link-local-v6', 'fe80::', 10, 'ipv6'],
  ['multicast-v6', 'ff00::', 8, 'ipv6'],
];

function range(rule: string, address: string, prefix: number, type: 'ipv4' | 'ipv6'): NamedRange {
  const list = new BlockList();
  list.addSubnet(address, prefix, type);
  return { rule, list };
}

/** `::ffff:1.2.3.4` is 1.2.3.4 for every check; anything else is returned as is. */
export function normalizeAddress(address: string): string {
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(address);
  return mapped?.[1] ?? address;
}

export function addressFamily(address: string): 'ipv4' | 'ipv6' | undefined {
  const family = isIP(address);
  return family === 4 ? 'ipv4' : family === 6 ? 'ipv6' : undefined;
}

/** Parses `a.b.c.d/n`, `x::/n` or a bare address; undefined when it is neither. */
export function parseCidr(text: string): { address: string; prefix: number; type: 'ipv4' | 'ipv6' } | undefined {
  const [address = '', bits] = text.split('/');
  const type = addressFamily(address);
  if (!type) return undefined;
  const prefix = bits === undefined ? (type === 'ipv4' ? 32 : 128) : Number(bits);
  if (!Number.isInteger(prefix) || prefix < 0 || prefix > (type === 'ipv4' ? 32 : 128)) return undefined;
  return { address, prefix, type };
}

/**
 * Decides whether an address is one a sandbox may never reach: the fixed ranges above, the
 * host's own addresses and the networks its interfaces sit on (its LAN and gateway).
 */
export class ForbiddenAddresses {
  private readonly ranges: NamedRange[];

  constructor(ranges: NamedRange[]) {
    this.ranges = ranges;
  }

  /** The fixed ranges only (what every host denies; tests of the rules themselves). */
  static fixed(): ForbiddenAddresses {
    return new ForbiddenAddresses(ALWAYS_DENIED.map(([rule, address, prefix, type]) => range(rule, address, prefix, type)));
  }

  /** The fixed ranges plus what `os.networkInterfaces()` shows now. */
  static forThisHost(): ForbiddenAddresses {
    const ranges = ALWAYS_DENIED.map(([rule, address, prefix, type]) => range(rule, address, prefix, type));
    for (const [name, infos] of Object.entries(networkInterfaces())) {
      for (const info of infos ?? []) {
        const type = info.family === 'IPv4' ? 'ipv4' : 'ipv6';
        ranges.push(range(`host-address (${name})`, info.address, type === 'ipv4' ? 32 : 128, type));
        const cidr = info.cidr ? parseCidr(info.cidr) : undefined;
        if (cidr && cidr.prefix >= (type === 'ipv4' ? 8 : 48)) {
          ranges.push(range(`host-network (${name} ${info.cidr})`, cidr.address, cidr.prefix, type));
        }
      }
    }
    return new ForbiddenAddresses(ranges);
  }

  /**
   * The rule that forbids `address`, or undefined when it is a public address. An IPv6 address
   * that carries an IPv4 one (NAT64, 6to4, Teredo, mapped, translated, compatible) is also judged
   * by the IPv4 address it carries: `loopback (in NAT64 64:ff9b::/96)`.
   */
  match(address: string): string | undefined {
    const ip = normalizeAddress(address).replace(/%.*$/, '');
    const type = addressFamily(ip);
    if (!type) return 'not-an-address';
    const direct = this.matchPlain(ip, type);
    if (direct) return direct;
    if (type === 'ipv4') return undefined;
    if (isAmbiguousLocalNat64(ip)) return 'nat64-local-use (only its /96 form is judged by the IPv4 address it carries)';
    for (const { ipv4, form } of embeddedIpv4(ip)) {
      const rule = this.matchPlain(ipv4, 'ipv4');
      if (rule) return `${rule} (in ${form})`;
    }
    return undefined;
  }

  private matchPlain(ip: string, type: 'ipv4' | 'ipv6'): string | undefined {
    for (const { rule, list } of this.ranges) if (list.check(ip, type)) return rule;
    return undefined;
  }
}
