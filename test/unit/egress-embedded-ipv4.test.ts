import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { ForbiddenAddresses } from '../../src/host/egress/addresses.js';
import { embeddedIpv4, ipv6Bytes } from '../../src/host/egress/embedded-ipv4.js';
import { CompiledPolicy, DestinationList } from '../../src/host/egress/policy.js';
import { parseSpec } from '../../src/sandbox-spec/index.js';

/*
 * Finding 9 of issue 11: IPv6 forms that carry an IPv4 address are judged by that address. Pure
 * functions only: no packet is sent to any of these addresses.
 */
const forbidden = ForbiddenAddresses.fixed();
const internet = new CompiledPolicy(parseSpec({ network: { mode: 'internet' } }).network, new DestinationList(['203.0.113.0/24'], { coversSubdomains: true }));

const hex = (a: number, b: number): string => ((a << 8) | b).toString(16);
type Quad = [number, number, number, number];

/** Every form that carries `v4`, as text an attacker could name (Teredo with a public server). */
function carriers([a, b, c, d]: Quad): Record<string, string> {
  const [ia, ib, ic, id] = [a ^ 0xff, b ^ 0xff, c ^ 0xff, d ^ 0xff];
  return {
    mapped: `::ffff:${hex(a, b)}:${hex(c, d)}`,
    mappedDotted: `0:0:0:0:0:ffff:${a}.${b}.${c}.${d}`,
    translated: `::ffff:0:${hex(a, b)}:${hex(c, d)}`,
    compatible: `::${a}.${b}.${c}.${d}`,
    nat64: `64:ff9b::${hex(a, b)}:${hex(c, d)}`,
    nat64Dotted: `64:ff9b::${a}.${b}.${c}.${d}`,
    nat64LocalUse: `64:ff9b:1::${hex(a, b)}:${hex(c, d)}`,
    sixToFour: `2002:${hex(a, b)}:${hex(c, d)}::1`,
    teredoClient: `2001:0:cb00:7101:8000:63bf:${hex(ia, ib)}:${hex(ic, id)}`,
    teredoServer: `2001:0:${hex(a, b)}:${hex(c, d)}:8000:63bf:3400:8efa`, // client 203.0.113.5, public
  };
}

const quad = fc.tuple(fc.nat(255), fc.nat(255), fc.nat(255), fc.nat(255)) as fc.Arbitrary<Quad>;

describe('IPv4 carried in IPv6 addresses (finding 9)', () => {
  it.each([
    ['64:ff9b::7f00:1', 'loopback (in NAT64 64:ff9b::/96)'],
    ['64:ff9b::127.0.0.1', 'loopback (in NAT64 64:ff9b::/96)'],
    ['64:ff9b::a9fe:a9fe', 'link-local (cloud metadata) (in NAT64 64:ff9b::/96)'],
    ['64:ff9b:1::a00:1', 'private-10 (in NAT64 local-use 64:ff9b:1::/48)'],
    ['::ffff:0:7f00:1', 'loopback (in IPv4-translated ::ffff:0:0:0/96)'],
    ['::127.0.0.1', 'loopback (in IPv4-compatible ::/96)'],
    ['::a00:1', 'private-10 (in IPv4-compatible ::/96)'],
    ['2002:c0a8:101::1', 'private-192 (in 6to4 2002::/16)'],
    ['2002:7f00:1:0:0:0:0:1', 'loopback (in 6to4 2002::/16)'],
    // Teredo: server 65.54.227.120 (public), client the inverted 0x80fffffe → 127.0.0.1.
    ['2001:0:4136:e378:8000:63bf:80ff:fffe', 'loopback (in Teredo client 2001::/32)'],
    ['2001::a9fe:a9fe:8000:63bf:3400:8efa', 'link-local (cloud metadata) (in Teredo server 2001::/32)'],
    ['::ffff:7f00:1', 'loopback'],
    ['::ffff:127.0.0.1', 'loopback'],
  ])('%s is denied as %s', (address, rule) => {
    expect(forbidden.match(address)).toBe(rule);
    expect(internet.checkAddress('x.test', address, 443, forbidden)?.rule).toBe(`always-deny:${rule}`);
  });

  it.each([
    '64:ff9b::cb00:7105', '64:ff9b::8.8.8.8', '64:ff9b:1::808:808', '2002:808:808::1', '::ffff:808:808',
    '2001:0:4136:e378:8000:63bf:f7f7:f7f7', // Teredo: public server, client 8.8.8.8
    '2001:db8::1', '2001:4860:4860::8888', '2606:4700::1111', // not Teredo (2001:0::/32 only), not carriers
  ])('%s carries a public address (or none) and is not denied', (address) => {
    expect(forbidden.match(address)).toBeUndefined();
  });

  it('denies the local-use NAT64 prefix outside its /96 form, where the IPv4 bits cannot be located', () => {
    expect(forbidden.match('64:ff9b:1:7f00:1::')).toMatch(/^nat64-local-use/);
    expect(forbidden.match('64:ff9b:1:0:7f:0:100::')).toMatch(/^nat64-local-use/);
  });

  it('judges every carried form exactly as the IPv4 address it carries (property)', () => {
    fc.assert(
      fc.property(quad, (v4) => {
        const plain = forbidden.match(v4.join('.')) !== undefined;
        const differing = Object.entries(carriers(v4)).filter(([, address]) => (forbidden.match(address) !== undefined) !== plain);
        expect(differing, `${v4.join('.')} is ${plain ? 'forbidden' : 'public'}`).toEqual([]);
      }),
      { numRuns: 1500 },
    );
    // CPU-bound: a starved machine (the soak ran it at load 13) needs minutes, not a wrong answer.
  }, 300_000);

  it('every forbidden IPv4 range stays forbidden in every carrier (property over the ranges)', () => {
    const ranges: [Quad, number][] = [[[127, 0, 0, 0], 8], [[10, 0, 0, 0], 8], [[172, 16, 0, 0], 12], [[192, 168, 0, 0], 16], [[169, 254, 0, 0], 16], [[100, 64, 0, 0], 10], [[0, 0, 0, 0], 8]];
    fc.assert(
      fc.property(fc.constantFrom(...ranges), fc.integer({ min: 0, max: 2 ** 32 - 1 }), ([base, prefix], noise) => {
        const hostBits = noise & (prefix === 32 ? 0 : 2 ** (32 - prefix) - 1);
        const value = ((((base[0] << 24) | (base[1] << 16) | (base[2] << 8) | base[3]) >>> 0) + hostBits) >>> 0;
        const v4: Quad = [value >>> 24, (value >>> 16) & 0xff, (value >>> 8) & 0xff, value & 0xff];
        expect(Object.values(carriers(v4)).filter((address) => forbidden.match(address) === undefined)).toEqual([]);
      }),
      { numRuns: 1000 },
    );
  });

  it("applies the operator's deny CIDRs to carried addresses, by name and after resolution", () => {
    expect(internet.checkName('64:ff9b::cb00:7105', 443)?.code).toBe('EGRESS_OPERATOR_DENY');
    expect(internet.checkName('2002:cb00:7105::1', 443)?.rule).toBe('operator-deny:203.0.113.0/24');
    expect(internet.checkAddress('cdn.test', '64:ff9b::203.0.113.9', 443, forbidden)?.code).toBe('EGRESS_OPERATOR_DENY');
    expect(internet.checkAddress('cdn.test', '64:ff9b::198.51.100.9', 443, forbidden)).toBeUndefined();
  });

  it('parses IPv6 text with compression, a dotted tail and a zone; refuses anything else', () => {
    expect([...(ipv6Bytes('::1') ?? [])]).toEqual([...Array<number>(15).fill(0), 1]);
    expect([...(ipv6Bytes('fe80::1%eth0') ?? [])].slice(0, 2)).toEqual([0xfe, 0x80]);
    expect([...(ipv6Bytes('::ffff:1.2.3.4') ?? [])].slice(10)).toEqual([0xff, 0xff, 1, 2, 3, 4]);
    expect(ipv6Bytes('1.2.3.4')).toBeUndefined();
    expect(ipv6Bytes('example.com')).toBeUndefined();
    expect(embeddedIpv4('2001:db8::1')).toEqual([]);
    fc.assert(
      fc.property(fc.ipV6(), (address) => {
        const bytes = ipv6Bytes(address);
        expect(bytes?.length, address).toBe(16);
      }),
      { numRuns: 2000 },
    );
  });
});
