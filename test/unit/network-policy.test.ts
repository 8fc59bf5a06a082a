import { describe, expect, it } from 'vitest';
import { networkInterfaces } from 'node:os';
import { parseSpec } from '../../src/sandbox-spec/index.js';
import { allowEntryProblem } from '../../src/sandbox-spec/schema.js';
import { CompiledPolicy, DestinationList } from '../../src/host/egress/policy.js';
import { ForbiddenAddresses } from '../../src/host/egress/addresses.js';
import { buildDnsAnswer, parseDnsQuery, RCODE_NXDOMAIN } from '../../src/host/egress/dns.js';
import { parseClientHello } from '../../src/host/egress/sni.js';
import { hostRuleset, sandboxRuleset } from '../../src/host/nftables.host.js';
import { DEFAULT_EGRESS_PORTS } from '../../src/host/egress/egress-proxy.js';
import { egressLimitHit } from '../../src/engine/network-limit.js';

const policy = (network: object) =>
  new CompiledPolicy(parseSpec({ network }).network, new DestinationList(['evil.example', '203.0.113.66/32'], { coversSubdomains: true }));
const forbidden = ForbiddenAddresses.forThisHost();

describe('allowlist entries (spec validation)', () => {
  it('accepts domains, wildcards, ports and CIDRs', () => {
    for (const entry of ['api.github.com', 'api.github.com:443', '*.pypi.org', '*.pypi.org:443', '203.0.113.0/24', '198.51.100.10', '2001:db8::/32']) {
      expect(allowEntryProblem(entry), entry).toBeUndefined();
    }
  });

  it('refuses a bare TLD, *, a wildcard over a TLD, /0 and bad ports', () => {
    expect(allowEntryProblem('*')).toMatch(/use mode "internet"/);
    expect(allowEntryProblem('com')).toMatch(/bare top-level domain/);
    expect(allowEntryProblem('*.com')).toMatch(/bare top-level domain/);
    expect(allowEntryProblem('0.0.0.0/0')).toMatch(/CIDR this wide/);
    expect(allowEntryProblem('::/0')).toMatch(/CIDR this wide/);
    expect(allowEntryProblem('example.com:0')).toMatch(/port/);
    expect(allowEntryProblem('example.com:70000')).toMatch(/port/);
    expect(allowEntryProblem('exa mple.com')).toMatch(/must be a domain/);
    expect(() => parseSpec({ network: { mode: 'allowlist', allow: ['*'] } })).toThrow(/allow entry "\*"/);
  });
});

describe('compiled policy', () => {
  it('matches exact names, subdomains of wildcards (not the apex) and ports', () => {
    const p = policy({ mode: 'allowlist', allow: ['api.github.com:443', '*.pypi.org'] });
    expect(p.checkName('api.github.com', 443)).toBeUndefined();
    expect(p.checkName('API.GitHub.com', 443)).toBeUndefined();
    expect(p.checkName('api.github.com', 80)?.code).toBe('EGRESS_NOT_ALLOWED');
    expect(p.checkName('files.pypi.org', 8443)).toBeUndefined();
    expect(p.checkName('pypi.org', 443)?.code).toBe('EGRESS_NOT_ALLOWED');
    expect(p.checkName('pypi.org.evil.example', 443)?.code).toBe('EGRESS_OPERATOR_DENY');
    expect(p.checkName('xpypi.org', 443)?.code).toBe('EGRESS_NOT_ALLOWED');
    expect(p.isNameResolvable('files.pypi.org')).toBe(true);
    expect(p.isNameResolvable('secret.api.github.com')).toBe(false);
  });

  it('allows address literals only through CIDR entries, and never forbidden addresses', () => {
    const p = policy({ mode: 'allowlist', allow: ['198.51.100.0/24', '169.254.0.0/16'] });
    expect(p.checkName('198.51.100.7', 80)).toBeUndefined();
    expect(p.checkName('198.51.101.7', 80)?.rule).toBe('allowlist');
    expect(p.checkAddress('198.51.100.7', '198.51.100.7', 80, forbidden)).toBeUndefined();
    expect(p.checkName('169.254.169.254', 80)).toBeUndefined();
    expect(p.checkAddress('169.254.169.254', '169.254.169.254', 80, forbidden)?.rule).toBe('always-deny:link-local (cloud metadata)');
  });

  it('lets the operator deny list override internet mode; mode none denies everything', () => {
    expect(policy({ mode: 'internet' }).checkName('www.evil.example', 443)?.rule).toBe('operator-deny:evil.example');
    expect(policy({ mode: 'internet' }).checkName('notevil.example', 443)).toBeUndefined();
    expect(policy({ mode: 'internet' }).checkName('evil.example', 443)?.rule).toBe('operator-deny:evil.example');
    expect(policy({ mode: 'internet' }).checkAddress('x.test', '203.0.113.66', 443, forbidden)?.code).toBe('EGRESS_OPERATOR_DENY');
    expect(policy({ mode: 'none' }).checkName('example.com', 443)?.code).toBe('EGRESS_NETWORK_DISABLED');
  });
});

describe('always-denied addresses', () => {
  it.each([
    ['127.0.0.1', 'loopback'], ['10.0.0.1', 'private-10'], ['172.31.255.255', 'private-172'], ['192.168.1.1', 'private-192'],
    ['100.64.0.1', 'cgnat'], ['169.254.169.254', 'link-local (cloud metadata)'], ['::1', 'loopback-v6'],
    ['fd12::1', 'unique-local-v6'], ['fe80::1', 'link-local-v6'], ['::ffff:127.0.0.1', 'loopback'], ['0.0.0.0', 'this-network'],
  ])('%s is %s', (address, rule) => {
    expect(forbidden.match(address)).toBe(rule);
  });

  it("denies the host's own addresses and leaves public ones alone", () => {
    expect(forbidden.match('198.51.100.10')).toBeUndefined();
    expect(forbidden.match('2001:db8::1')).toBeUndefined();
    const own = Object.values(networkInterfaces()).flat().find((info) => info && !info.internal && info.family === 'IPv4');
    if (own) expect(forbidden.match(own.address)).toMatch(/^host-(address|network)/);
  });
});

describe('resolver packets', () => {
  const query = Buffer.concat([
    Buffer.from([0xab, 0xcd, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]),
    Buffer.from([3, ...Buffer.from('api'), 6, ...Buffer.from('GitHub'), 3, ...Buffer.from('com'), 0, 0, 1, 0, 1]),
  ]);

  it('parses a query and answers A records with the question echoed', () => {
    const q = parseDnsQuery(query);
    expect(q).toMatchObject({ id: 0xabcd, name: 'api.github.com', type: 1, recursionDesired: true });
    const answer = buildDnsAnswer(q!, 0, ['10.213.7.1']);
    expect(answer.readUInt16BE(0)).toBe(0xabcd);
    expect(answer.readUInt16BE(6)).toBe(1); // one answer
    expect([...answer.subarray(answer.length - 4)]).toEqual([10, 213, 7, 1]);
  });

  it('answers NXDOMAIN without records and refuses malformed packets', () => {
    const answer = buildDnsAnswer(parseDnsQuery(query)!, RCODE_NXDOMAIN, ['10.0.0.1']);
    expect(answer.readUInt16BE(2) & 0xf).toBe(3);
    expect(answer.readUInt16BE(6)).toBe(0);
    expect(parseDnsQuery(query.subarray(0, 14))).toBeUndefined();
  });
});

describe('TLS ClientHello', () => {
  it('reads nothing from non-TLS bytes and waits for a whole record', () => {
    expect(parseClientHello(Buffer.from('GET / HTTP/1.1\r\n'))).toEqual({ kind: 'not-tls' });
    expect(parseClientHello(Buffer.from('ping'))).toEqual({ kind: 'not-tls' }); // short, but plainly not TLS
    expect(parseClientHello(Buffer.from([0x16, 0x03, 0x01, 0x02, 0x00, 0x01]))).toEqual({ kind: 'incomplete' });
  });
});

describe('nftables rulesets', () => {
  it('redirect 80/443/53 inside the sandbox to the proxy and refuse everything else at once', () => {
    const text = sandboxRuleset('10.213.7.1', DEFAULT_EGRESS_PORTS);
    expect(text).toContain('tcp dport 80 dnat ip to 10.213.7.1:3129');
    expect(text).toContain('tcp dport 443 dnat ip to 10.213.7.1:3130');
    expect(text).toContain('udp dport 53 dnat ip to 10.213.7.1:3153');
    expect(text).toContain('meta l4proto tcp reject with tcp reset');
    expect(text).toMatch(/hook output priority 0; policy drop;/);
  });

  it('on the host, open only the proxy ports from sandbox veths and forward nothing', () => {
    const text = hostRuleset({ table: 'capsule_abc123', vethPattern: 'cpabc123h*', proxyAddress: '10.213.7.1', subnet: '10.213.7.0/24', ports: DEFAULT_EGRESS_PORTS, connectionsPerSandbox: 3072 });
    expect(text).toContain('iifname "cpabc123h*" ip daddr 10.213.7.1 tcp dport { 3128, 3129, 3130 } accept');
    // Connections to the proxy are bounded per sandbox address in the kernel too, before the accept.
    expect(text).toContain(
      'iifname "cpabc123h*" ip daddr 10.213.7.1 tcp dport { 3128, 3129, 3130 } ct state new add @proxy_connections { ip saddr ct count over 3072 } reject with tcp reset\n' +
      '    iifname "cpabc123h*" ip daddr 10.213.7.1 tcp dport { 3128, 3129, 3130 } accept',
    );
    expect(text).toContain('iifname "cpabc123h*" drop');
    // gVisor's netstack bypasses the namespace's redirects: the host redirects DNS and web ports.
    expect(text).toContain('iifname "cpabc123h*" udp dport 53 dnat ip to 10.213.7.1:3153');
    expect(text).toContain('iifname "cpabc123h*" tcp dport 443 dnat ip to 10.213.7.1:3130');
    expect(text).toContain('oifname "cpabc123h*" drop');
    expect(text.startsWith('table inet capsule_abc123\ndelete table inet capsule_abc123\n')).toBe(true);
  });
});

describe('network spec', () => {
  it('refuses handles without a network', () => {
    expect(() => parseSpec({ network: { handles: ['docs.read'] } })).toThrow(/credential handles need a network/);
    expect(parseSpec({ network: { mode: 'allowlist', handles: ['docs.read'] } }).network.handles).toEqual(['docs.read']);
  });
});

describe('egress limit classification', () => {
  const counters = { oomKills: 0, pidsMaxEvents: 0, memoryPeakBytes: 0, memoryUsageBytes: 0, cpuUsageUsec: 0, cpuThrottledUsec: 0 };
  it('reports refused connections of a failed exec as the egress limit', () => {
    const hit = egressLimitHit({ ...counters, egressLimitHits: 1 }, { ...counters, egressLimitHits: 3 }, { maxConnections: 10, maxConcurrentConnections: 256 }, true);
    expect(hit).toMatchObject({ resource: 'egress', limit: 10, unit: 'count' });
    expect(hit?.message).toBe('outbound connection limit 10 reached (2 connections refused with 429 or reset); raise network.maxConnections or reuse connections.');
  });

  it('leaves a program that handled the 429 (exit 0), or saw none, alone', () => {
    const network = { maxConnections: 10, maxConcurrentConnections: 256 };
    expect(egressLimitHit(counters, { ...counters, egressLimitHits: 1 }, network, false)).toBeUndefined();
    expect(egressLimitHit(counters, counters, network, true)).toBeUndefined();
  });

  it('names the concurrent-connection limit, or the proxy\'s capacity, when that is what refused', () => {
    const network = { maxConnections: 4096, maxConcurrentConnections: 256 };
    const concurrency = egressLimitHit(counters, { ...counters, egressLimitHits: 9744, egressConcurrencyHits: 9744 }, network, true);
    expect(concurrency).toMatchObject({ resource: 'egress', limit: 256, used: 256, unit: 'count' });
    expect(concurrency?.message).toBe(
      'concurrent connection limit 256 reached (9744 connections refused with a reset or 429 while 256 were open); ' +
        'close idle connections, reuse them (HTTP keep-alive) or raise network.maxConcurrentConnections.',
    );
    const capacity = egressLimitHit(counters, { ...counters, egressLimitHits: 1, egressCapacityHits: 1, egressCapacity: 15000 }, network, true);
    expect(capacity).toMatchObject({ resource: 'egress', limit: 15000 });
    // The proxy's capacity covers its data disk too (a connection bound it could not record).
    expect(capacity?.message).toMatch(/^the egress proxy was at its capacity of 15000 connections for all sandboxes, or could not record connection counts on its data disk \(1 connection refused\)/);
  });
});
