import { runCommand } from './run-command.host.js';
import type { EgressPorts } from './egress/egress-proxy.js';

export interface HostRulesetOptions {
  /** Table name of this Capsule instance, e.g. `capsule_1a2b3c`. */
  table: string;
  /** Interface-name wildcard of the host ends of sandbox veths, e.g. `cp1a2b3ch*`. */
  vethPattern: string;
  proxyAddress: string;
  /** The instance's sandbox subnet (`10.213.7.0/24`). */
  subnet: string;
  ports: EgressPorts;
  /**
   * Connections to the proxy one sandbox address may hold in the kernel's connection tracking;
   * past it a new one is reset before the proxy accepts it. A backstop above the proxy's own
   * per-sandbox limit (the operator's maximum plus a margin), so the proxy normally refuses and
   * counts first.
   */
  connectionsPerSandbox: number;
}

/** What the kernel lets a sandbox hold beyond the operator's maximum: the proxy's three accept backlogs (511 each) and refusals in flight. */
export function kernelConnectionCap(maxConcurrentConnections: number): number {
  return maxConcurrentConnections + 2048;
}

/**
 * The host side: from a sandbox veth only the proxy's ports on the anchor address are open
 * (the rest is refused at once), no more than `connectionsPerSandbox` connections at once per
 * sandbox address (counted by conntrack, refused with a reset), nothing is forwarded to or from a veth, a veth may only speak
 * with its own source address, and the sandbox subnet is not reachable from other interfaces.
 * DNS and TCP 80/443 arriving from a veth are redirected to the proxy here too: a gVisor
 * sandbox's own network stack sends packets straight onto the veth, past the namespace's rules
 * that redirect them for the namespace backend (whose packets arrive already redirected).
 * Wildcards on interface names keep the ruleset fixed: adding a sandbox touches no host rule.
 */
export function hostRuleset(o: HostRulesetOptions): string {
  const tcp = `{ ${o.ports.proxy}, ${o.ports.http}, ${o.ports.tls} }`;
  return `table inet ${o.table}
delete table inet ${o.table}
table inet ${o.table} {
  set proxy_connections {
    type ipv4_addr; size 65535; flags dynamic;
  }
  chain prerouting {
    type filter hook prerouting priority -160; policy accept;
    iifname "${o.vethPattern}" fib saddr . iif oif missing drop
  }
  chain dstnat {
    type nat hook prerouting priority dstnat; policy accept;
    iifname "${o.vethPattern}" udp dport 53 dnat ip to ${o.proxyAddress}:${o.ports.dns}
    iifname "${o.vethPattern}" tcp dport 80 dnat ip to ${o.proxyAddress}:${o.ports.http}
    iifname "${o.vethPattern}" tcp dport 443 dnat ip to ${o.proxyAddress}:${o.ports.tls}
  }
  chain input {
    type filter hook input priority -10; policy accept;
    iifname "${o.vethPattern}" ip daddr ${o.proxyAddress} tcp dport ${tcp} ct state new add @proxy_connections { ip saddr ct count over ${o.connectionsPerSandbox} } reject with tcp reset
    iifname "${o.vethPattern}" ip daddr ${o.proxyAddress} tcp dport ${tcp} accept
    iifname "${o.vethPattern}" ip daddr ${o.proxyAddress} udp dport ${o.ports.dns} accept
    iifname "${o.vethPattern}" meta l4proto tcp reject with tcp reset
    iifname "${o.vethPattern}" reject with icmpx admin-prohibited
    ip daddr ${o.subnet} iifname != "${o.vethPattern}" iifname != "lo" drop
  }
  chain forward {
    type filter hook forward priority -10; policy accept;
    iifname "${o.vethPattern}" drop
    oifname "${o.vethPattern}" drop
  }
}
`;
}

/**
 * Inside a sandbox's namespace: loopback, the proxy's ports and DNS to the proxy; TCP 80 and
 * 443 to anywhere are redirected to the proxy's transparent listeners (clients that ignore
 * HTTP(S)_PROXY, like Node's fetch); DNS to any server goes to the proxy's resolver; every other
 * packet is refused at once (TCP reset, ICMP admin-prohibited, so UDP sends fail with EPERM).
 */
export function sandboxRuleset(proxyAddress: string, ports: EgressPorts): string {
  const p = proxyAddress;
  return `table inet capsule
delete table inet capsule
table inet capsule {
  chain nat_output {
    type nat hook output priority -100; policy accept;
    ip daddr 127.0.0.0/8 return
    tcp dport 80 dnat ip to ${p}:${ports.http}
    tcp dport 443 dnat ip to ${p}:${ports.tls}
    udp dport 53 dnat ip to ${p}:${ports.dns}
  }
  chain output {
    type filter hook output priority 0; policy drop;
    oif "lo" accept
    ip daddr ${p} tcp dport { ${ports.proxy}, ${ports.http}, ${ports.tls} } accept
    ip daddr ${p} udp dport ${ports.dns} accept
    meta l4proto tcp reject with tcp reset
    reject with icmpx admin-prohibited
  }
  chain input {
    type filter hook input priority 0; policy drop;
    iif "lo" accept
    ct state established,related accept
  }
}
`;
}

/** Loads a ruleset atomically with `nft -f -` (in `netnsPath`'s namespace when given). */
export async function applyRuleset(text: string, netnsPath?: string): Promise<void> {
  const argv = netnsPath ? ['nsenter', `--net=${netnsPath}`, 'nft', '-f', '-'] : ['nft', '-f', '-'];
  await runCommand(argv, { input: text, timeoutMs: 10_000 });
}

export async function deleteTable(family: string, name: string): Promise<void> {
  await runCommand(['nft', 'delete', 'table', family, name], { timeoutMs: 10_000 });
}

/** Host tables whose name starts with `prefix`, as `[family, name]`. */
export async function listTables(prefix: string): Promise<[string, string][]> {
  const result = await runCommand(['nft', 'list', 'tables'], { timeoutMs: 10_000 });
  const tables: [string, string][] = [];
  for (const line of result.stdout.split('\n')) {
    const match = /^table (\S+) (\S+)$/.exec(line.trim());
    if (match?.[1] && match[2]?.startsWith(prefix)) tables.push([match[1], match[2]]);
  }
  return tables;
}
