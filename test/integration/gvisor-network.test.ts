import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { readFile, writeFile } from 'node:fs/promises';
import { basename, join } from 'node:path';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { EgressNetwork } from '../../src/host/netns-network.host.js';
import { listInstanceLinks, listInstanceNetns } from '../../src/host/netns-pool.host.js';
import { listTables } from '../../src/host/nftables.host.js';
import { createBackends } from '../../src/backends/registry.js';
import { GvisorLayout } from '../../src/backends/gvisor/layout.js';
import type { OciSpec } from '../../src/backends/gvisor/oci-bundle.js';
import { baseEnv } from '../../src/host/sandbox-layout.js';
import { superviseExec } from '../../src/engine/supervise.js';
import { newSandboxId } from '../../src/engine/ids.js';
import { parseSpec, type SandboxSpecInput } from '../../src/sandbox-spec/index.js';
import type { Backend, BackendSandbox } from '../../src/backends/backend.js';
import type { ExecResult } from '../../src/wire/index.js';
import { FAKE_ADDRESSES, FakeInternet } from './network-fake-internet.js';

/*
 * Real gVisor sandboxes in the same egress network as the namespace backend's. Every destination
 * is the fake internet (198.51.100.0/24 in a namespace this file makes) or the proxy; the proxy
 * resolves names only from its hosts map (hostsOnly), so no query or packet leaves the machine.
 */
const host = new HostEnvironment({ dataDir: testDataDir() });
let fake: FakeInternet;
let network: EgressNetwork;
let backends: Backend[];
let gvisor: Backend;

beforeAll(async () => {
  await host.ensure();
  network = new EgressNetwork({
    host,
    poolSize: 1,
    hostsOnly: true,
    hosts: { 'allowed.test': [FAKE_ADDRESSES[0]], 'other.test': [FAKE_ADDRESSES[1]] },
  });
  fake = new FakeInternet(network.names);
  await fake.start();
  backends = createBackends(host, { namespace: { network } });
  gvisor = backends.find((b) => b.name === 'gvisor')!;
});

afterAll(async () => {
  for (const backend of backends ?? []) await backend.close?.();
  await fake?.stop();
  expect(await listInstanceNetns(network.names)).toEqual([]);
  expect(await listInstanceLinks(network.names)).toEqual([]);
  expect(await listTables(network.names.table)).toEqual([]);
});

// The pool refills in the background; its ready namespaces are not leaks.
afterEach(async () => {
  await network.warm();
  await expectNoLeaks();
});

const ALLOW = { mode: 'allowlist' as const, allow: ['allowed.test'] };

async function inSandbox(net: SandboxSpecInput['network'], body: (sandbox: BackendSandbox) => Promise<void>): Promise<void> {
  const sandbox = await gvisor.create(parseSpec({ backend: 'gvisor', network: net, limits: { wallClockMs: 20_000 } }), { id: newSandboxId() });
  try {
    await writeFile(join(sandbox.workspaceDir, 'ca.pem'), fake.certPem, { mode: 0o644 });
    await body(sandbox);
  } catch (error) {
    (error as Error).message = `sandbox ${sandbox.id}: ${(error as Error).message}`;
    throw error;
  } finally {
    await sandbox.destroy();
  }
}

function sh(sandbox: BackendSandbox, script: string, env: Record<string, string> = {}): Promise<ExecResult> {
  return superviseExec(sandbox, { argv: ['bash', '-c', script], env: { ...baseEnv(), ...env }, cwd: '/workspace' }, { timeoutMs: 20_000 });
}

const show = (r: ExecResult): string => JSON.stringify({ exit: r.exitCode, out: r.stdout.slice(-1500), err: r.stderr.slice(0, 800) });

describe('gvisor sandboxes in the shared egress network', () => {
  it('reports network capabilities only when wired to an egress network', async () => {
    expect((await gvisor.probe()).capabilities).toEqual(expect.arrayContaining(['network.allowlist', 'network.internet']));
    const unwired = createBackends(host).find((b) => b.name === 'gvisor')!;
    expect((await unwired.probe()).capabilities).not.toContain('network.allowlist');
  });

  it('proxy-aware clients reach an allowed host, a denied one gets 403, and the rest fails closed', async () => {
    await inSandbox(ALLOW, async (sandbox) => {
      const r = await sh(sandbox, [
        'grep nameserver /etc/resolv.conf; echo "$HTTPS_PROXY $NO_PROXY"',
        'curl -sS http://allowed.test/ok; curl -sS --cacert ca.pem https://allowed.test/ok',
        'python3 -c \'import urllib.request; print(urllib.request.urlopen("http://allowed.test/py").read().decode(), end="")\'',
        'curl -sS http://other.test/; echo',
        'curl -sS --cacert ca.pem https://other.test/ 2>&1; echo "exit=$?"',
      ].join('\n'));
      expect(r.exitCode, show(r)).toBe(0);
      const lines = r.stdout.split('\n');
      expect(lines[0]).toBe(`nameserver ${network.proxyAddress}`);
      expect(lines[1]).toBe(`http://${network.proxyAddress}:3128 localhost,127.0.0.1,::1`);
      expect(lines.slice(2, 5)).toEqual(Array(3).fill('hello from allowed.test via 198.51.100.10'));
      expect(JSON.parse(lines[5] ?? '')).toMatchObject({ code: 'EGRESS_NOT_ALLOWED', rule: 'allowlist', destination: 'other.test:80' });
      expect(r.stdout).toMatch(/CONNECT tunnel failed, response 403[\s\S]*exit=56/);
      expect((await sandbox.counters()).egressBlocked).toBe(2);
    });
  });

  it('reaches nothing directly: DNS and web ports land on the proxy, other TCP, UDP and host ports fail', async () => {
    await inSandbox({ mode: 'internet' }, async (sandbox) => {
      const before = await fake.udpPackets();
      const r = await sh(sandbox, [
        // gVisor's netstack sends straight onto the veth: the host redirects port 80 to the proxy.
        `curl -sS --max-time 2 --noproxy '*' http://${FAKE_ADDRESSES[0]}/; echo "direct-http=$?"`,
        `curl -sS --max-time 2 --noproxy '*' telnet://${FAKE_ADDRESSES[0]}:7000 </dev/null 2>/dev/null; echo "direct-tcp=$?"`,
        `curl -sS --max-time 2 --noproxy '*' http://${network.proxyAddress}:22/ 2>/dev/null; echo "host-port=$?"`,
        `python3 -c 'import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); [s.sendto(b"x", ("${FAKE_ADDRESSES[0]}", 9999)) for _ in range(5)]'; echo "udp=$?"`,
        // The proxy's resolver answers with its own address, so clients that ignore the proxy
        // variables (Node 20 fetch) connect to it and are held to the policy by Host and SNI.
        'getent hosts allowed.test | cut -d" " -f1; echo "dns=$?"',
        'node -e \'fetch("http://allowed.test/ok").then((r) => r.text()).then((t) => console.log("fetch=" + t.trim()), (e) => console.log("fetch=" + e.cause?.code))\'',
        'curl -sS http://other.test/ok',
      ].join('\n'));
      expect(r.stdout, show(r)).toBe(
        `hello from ${FAKE_ADDRESSES[0]} via ${FAKE_ADDRESSES[0]}\ndirect-http=0\n` +
          `direct-tcp=28\n${/host-port=(7|28)/.exec(r.stdout)?.[0] ?? 'host-port=?'}\nudp=0\n` +
          `${network.proxyAddress}\ndns=0\nfetch=hello from allowed.test via 198.51.100.10\nhello from other.test via 198.51.100.11\n`,
      );
      // The fake internet counted none of the datagrams.
      expect(await fake.udpPackets()).toBe(before);
    });
  });

  it('holds redirected connections to the allowlist: Node fetch and a raw IP are denied, DNS of a denied name fails', async () => {
    await inSandbox(ALLOW, async (sandbox) => {
      const r = await sh(sandbox, [
        'node -e \'fetch("http://allowed.test/ok").then((r) => r.text()).then((t) => console.log("allowed=" + t.trim()), (e) => console.log("allowed=" + e.cause?.code))\'',
        'node -e \'fetch("http://other.test/").then((r) => console.log("other=" + r.status), (e) => console.log("other=" + e.cause?.code))\'',
        `curl -sS --noproxy '*' http://${FAKE_ADDRESSES[1]}/; echo`,
      ].join('\n'));
      const lines = r.stdout.split('\n');
      expect(lines[0], show(r)).toBe('allowed=hello from allowed.test via 198.51.100.10');
      expect(lines[1], show(r)).toBe('other=ENOTFOUND');
      expect(JSON.parse(lines[2] ?? ''), show(r)).toMatchObject({ code: 'EGRESS_NOT_ALLOWED', destination: `${FAKE_ADDRESSES[1]}:80` });
    });
  });

  it('follows a runtime policy change at once', async () => {
    await inSandbox(ALLOW, async (sandbox) => {
      const status = async (url: string): Promise<string> => (await sh(sandbox, `curl -sS -o /dev/null -w "%{http_code}" ${url}`)).stdout;
      expect(await status('http://other.test/')).toBe('403');
      await sandbox.setNetworkPolicy!({ ...sandbox.spec.network, mode: 'allowlist', allow: ['other.test'] });
      expect(await status('http://other.test/')).toBe('200');
      expect(await status('http://allowed.test/')).toBe('403');
    });
  });

  it('refuses to pause a sandbox with a network (runsc takes the address off eth0), and keeps running', async () => {
    await inSandbox(ALLOW, async (sandbox) => {
      for (const keepMemory of [true, false]) {
        await expect(sandbox.pause!({ keepMemory })).rejects.toMatchObject({ code: 'UNIMPLEMENTED' });
      }
      const r = await sh(sandbox, 'curl -sS http://allowed.test/still');
      expect(r.stdout, show(r)).toBe('hello from allowed.test via 198.51.100.10\n');
    });
  });

  it('destroy gives the namespace back: neither its netns nor its veth is left', async () => {
    let netns = '';
    await inSandbox(ALLOW, async (sandbox) => {
      const config = JSON.parse(await readFile(new GvisorLayout(host.dataDir).bundleDir(sandbox.id) + '/config.json', 'utf8')) as OciSpec;
      netns = basename(config.linux.namespaces.find((ns) => ns.type === 'network')?.path ?? '');
      expect(await listInstanceNetns(network.names)).toContain(netns);
    });
    const veth = network.names.veth(network.names.slotOf(netns) ?? -1);
    expect(await listInstanceNetns(network.names)).not.toContain(netns);
    expect(await listInstanceLinks(network.names)).not.toContain(veth);
  });
});
