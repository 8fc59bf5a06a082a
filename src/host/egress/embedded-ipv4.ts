import { isIPv6 } from 'node:net';

/** An IPv4 address carried inside an IPv6 one, and the form that carries it. */
export interface EmbeddedIpv4 {
  /** Dotted quad. */
  ipv4: string;
  /** How it is carried, e.g. `NAT64 64:ff9b::/96`, `Teredo client`. */
  form: string;
}

/**
 * The 16 bytes of an IPv6 address (`::` compression, a trailing dotted quad and a `%zone` are
 * understood); undefined when `text` is not IPv6.
 */
export function ipv6Bytes(text: string): Uint8Array | undefined {
  const address = text.replace(/%.*$/, '');
  if (!isIPv6(address)) return undefined;
  let groups: string[];
  const quad = /^(.*:)(\d+\.\d+\.\d+\.\d+)$/.exec(address);
  const head = quad ? `${quad[1]}0:0` : address;
  const [left = '', right] = head.split('::');
  const leftGroups = left === '' ? [] : left.split(':');
  if (right === undefined) groups = leftGroups;
  else {
    const rightGroups = right === '' ? [] : right.split(':');
    groups = [...leftGroups, ...Array<string>(8 - leftGroups.length - rightGroups.length).fill('0'), ...rightGroups];
  }
  if (groups.length !== 8) return undefined;
  const bytes = new Uint8Array(16);
  groups.forEach((group, index) => {
    const value = parseInt(group, 16);
    bytes[index * 2] = value >> 8;
    bytes[index * 2 + 1] = value & 0xff;
  });
  if (quad) (quad[2] ?? '').split('.').forEach((octet, index) => (bytes[12 + index] = Number(octet)));
  return bytes;
}

const dotted = (bytes: ArrayLike<number>, from: number, invert = false): string =>
  [0, 1, 2, 3].map((i) => ((bytes[from + i] ?? 0) ^ (invert ? 0xff : 0)) & 0xff).join('.');

const zeros = (bytes: Uint8Array, from: number, to: number): boolean => bytes.subarray(from, to).every((b) => b === 0);

/**
 * Every IPv4 address an IPv6 address carries in a form some translator, tunnel or stack turns
 * back into IPv4: IPv4-mapped `::ffff:0:0/96`, IPv4-translated `::ffff:0:0:0/96` (SIIT),
 * IPv4-compatible `::/96`, NAT64 `64:ff9b::/96` and the local-use `64:ff9b:1::/48` (its /96 form,
 * RFC 8215), 6to4 `2002::/16`, Teredo `2001::/32` (the server, and the client as the inverted
 * last 32 bits). A sandbox must not reach through one of these what it may not reach directly,
 * so the address rules judge each carried IPv4 address as well as the IPv6 one.
 */
export function embeddedIpv4(text: string): EmbeddedIpv4[] {
  const b = ipv6Bytes(text);
  if (!b) return [];
  const found: EmbeddedIpv4[] = [];
  if (zeros(b, 0, 10) && b[10] === 0xff && b[11] === 0xff) found.push({ ipv4: dotted(b, 12), form: 'IPv4-mapped ::ffff:0:0/96' });
  if (zeros(b, 0, 8) && b[8] === 0xff && b[9] === 0xff && zeros(b, 10, 12)) found.push({ ipv4: dotted(b, 12), form: 'IPv4-translated ::ffff:0:0:0/96' });
  // ::/96 minus :: and ::1, which are IPv6's own unspecified and loopback addresses.
  if (zeros(b, 0, 12) && !(zeros(b, 12, 15) && (b[15] ?? 0) <= 1)) found.push({ ipv4: dotted(b, 12), form: 'IPv4-compatible ::/96' });
  if (b[0] === 0x00 && b[1] === 0x64 && b[2] === 0xff && b[3] === 0x9b) {
    if (zeros(b, 4, 12)) found.push({ ipv4: dotted(b, 12), form: 'NAT64 64:ff9b::/96' });
    else if (b[4] === 0x00 && b[5] === 0x01 && zeros(b, 6, 12)) found.push({ ipv4: dotted(b, 12), form: 'NAT64 local-use 64:ff9b:1::/48' });
  }
  if (b[0] === 0x20 && b[1] === 0x02) found.push({ ipv4: dotted(b, 2), form: '6to4 2002::/16' });
  if (b[0] === 0x20 && b[1] === 0x01 && b[2] === 0x00 && b[3] === 0x00) {
    found.push({ ipv4: dotted(b, 4), form: 'Teredo server 2001::/32' }, { ipv4: dotted(b, 12, true), form: 'Teredo client 2001::/32' });
  }
  return found;
}

/**
 * Whether an address in the local-use NAT64 prefix is not in the /96 form whose IPv4 address
 * `embeddedIpv4` reads. Its other layouts (/48 to /64, RFC 6052) put the IPv4 bits elsewhere
 * and cannot be told apart; the prefix is local to someone's network, so those are denied.
 */
export function isAmbiguousLocalNat64(text: string): boolean {
  const b = ipv6Bytes(text);
  return b !== undefined && b[0] === 0x00 && b[1] === 0x64 && b[2] === 0xff && b[3] === 0x9b && b[4] === 0x00 && b[5] === 0x01 && !zeros(b, 6, 12);
}
