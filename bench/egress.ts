/**
 * Egress cost. (1) Added latency of an allowed HTTPS request through the egress proxy versus
 * direct to the same local upstream: a fresh TCP+TLS connection per request, as a sandboxed tool
 * makes it, by CONNECT (proxy-aware clients) and by the transparent TLS listener that reads the
 * SNI (clients like Node's fetch). (2) Sandbox create time with a network taken from the ready
 * namespace pool, made on demand, and without a network. Everything stays on 127.0.0.1 and this
 * host; interleaved so the machine's noise hits every contender alike.
 *
 *   node dist/bench/egress.js [--n 200] [--creates 15] [--json]
 */
import { spawnSync } from 'node:child_process';
import { createServer as createHttpsServer } from 'node:https';
import { connect as netConnect, type AddressInfo, type Socket } from 'node:net';
import { connect as tlsConnect } from 'node:tls';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { EgressProxy } from '../src/host/egress/egress-proxy.js';
import { ForbiddenAddresses } from '../src/host/egress/addresses.js';
import { HostEnvironment } from '../src/host/host-env.host.js';
import { EgressNetwork } from '../src/host/netns-network.host.js';
import { NamespaceBackend } from '../src/backends/namespace/namespace-backend.host.js';
import { newSandboxId } from '../src/engine/ids.js';
import { parseSpec, type SandboxSpec } from '../src/sandbox-spec/index.js';
import { summarize, table, timeIt, type Summary } from './stats.js';

const NAME = 'bench.test';

/** One HTTPS GET over `socket` (already connected to something that reaches the upstream). */
function httpsGet(socket: Socket | undefined, port: number, ca: Buffer): Promise<void> {
  return new Promise((resolve, reject) => {
    const tls = tlsConnect({ ...(socket ? { socket } : { host: '127.0.0.1', port }), servername: NAME, ca });
    let body = '';
    tls.once('secureConnect', () => tls.write(`GET / HTTP/1.1\r\nHost: ${NAME}\r\nConnection: close\r\n\r\n`));
    tls.on('data', (chunk: Buffer) => (body += chunk.toString()));
    tls.once('end', () => (body.startsWith('HTTP/1.1 200') ? resolve() : reject(new Error(`bad answer: ${body.slice(0, 80)}`))));
    tls.once('error', reject);
  });
}

function connectTunnel(proxyPort: number, upstreamPort: number): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const socket = netConnect({ host: '127.0.0.1', port: proxyPort }, () => socket.write(`CONNECT ${NAME}:${upstreamPort} HTTP/1.1\r\nHost: ${NAME}\r\n\r\n`));
    socket.once('data', (chunk: Buffer) => (chunk.toString().startsWith('HTTP/1.1 200') ? resolve(socket) : reject(new Error(chunk.toString()))));
    socket.once('error', reject);
  });
}

async function proxyLatency(n: number): Promise<Summary[]> {
  const dir = await mkdtemp(join(tmpdir(), 'capsule-bench-egress-'));
  const [cert, key] = [join(dir, 'cert.pem'), join(dir, 'key.pem')];
  spawnSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-days', '1',
    '-subj', `/CN=${NAME}`, '-addext', `subjectAltName=DNS:${NAME}`, '-keyout', key, '-out', cert], { stdio: 'ignore' });
  const ca = await readFile(cert);
  const upstream = createHttpsServer({ cert: ca, key: await readFile(key) }, (_req, res) => res.end('ok'));
  await new Promise<void>((resolve) => upstream.listen(0, '127.0.0.1', resolve));
  const upstreamPort = (upstream.address() as AddressInfo).port;
  // The upstream is on loopback here, so the always-deny ranges are left out: this measures the
  // proxy's own work (decision, connect, splice), not the policy's refusal of loopback.
  const proxy = new EgressProxy({
    address: '127.0.0.1',
    ports: { proxy: 0, http: 0, tls: 0, dns: 0 },
    hosts: { [NAME]: ['127.0.0.1'] },
    hostsOnly: true,
    forbidden: new ForbiddenAddresses([]),
    transparentPorts: { http: 80, tls: upstreamPort },
    log: () => undefined,
  });
  await proxy.start();
  proxy.register('bench', '127.0.0.1', parseSpec({ network: { mode: 'allowlist', allow: [NAME], maxConnections: 1_000_000 } }).network);
  const contenders: Record<string, () => Promise<void>> = {
    'direct HTTPS (new connection)': () => httpsGet(undefined, upstreamPort, ca),
    'via proxy: CONNECT + HTTPS': async () => httpsGet(await connectTunnel(proxy.ports.proxy, upstreamPort), upstreamPort, ca),
    'via proxy: redirected TLS (SNI)': () => httpsGet(undefined, proxy.ports.tls, ca),
  };
  const samples: Record<string, number[]> = Object.fromEntries(Object.keys(contenders).map((k) => [k, []]));
  try {
    for (const fn of Object.values(contenders)) for (let i = 0; i < 10; i++) await fn();
    for (let i = 0; i < n; i++) for (const [name, fn] of Object.entries(contenders)) samples[name]!.push(await timeIt(fn));
  } finally {
    await proxy.close();
    await new Promise((resolve) => upstream.close(resolve));
    await rm(dir, { recursive: true, force: true });
  }
  return Object.entries(samples).map(([name, s]) => summarize(name, s));
}

async function createTimes(n: number): Promise<Summary[]> {
  const dataDir = await mkdtemp(join(tmpdir(), 'capsule-bench-'));
  const host = new HostEnvironment({ dataDir, volumeBytes: 4 * 1024 ** 3 });
  await host.ensure();
  const none = parseSpec({});
  const allow = parseSpec({ network: { mode: 'allowlist', allow: ['example.com'] } });
  const samples: Record<string, number[]> = { 'no network': [], 'allowlist, namespace from the pool': [], 'allowlist, namespace made on demand': [] };
  const once = async (backend: NamespaceBackend, spec: SandboxSpec): Promise<number> => {
    let sandbox: Awaited<ReturnType<NamespaceBackend['create']>> | undefined;
    const ms = await timeIt(async () => (sandbox = await backend.create(spec, { id: newSandboxId() })));
    await sandbox?.destroy();
    return ms;
  };
  try {
    for (const poolSize of [2, 0]) {
      const network = new EgressNetwork({ host, poolSize, hostsOnly: true, log: () => undefined });
      const backend = new NamespaceBackend({ host, network });
      const label = poolSize > 0 ? 'allowlist, namespace from the pool' : 'allowlist, namespace made on demand';
      try {
        await network.warm();
        await once(backend, none);
        await once(backend, allow);
        for (let i = 0; i < n; i++) {
          if (poolSize > 0) samples['no network']!.push(await once(backend, none));
          await network.warm();
          samples[label]!.push(await once(backend, allow));
        }
      } finally {
        await backend.close();
      }
    }
  } finally {
    await new NamespaceBackend({ host }).reconcile(new Set());
    await host.volume.unmount();
    await rm(dataDir, { recursive: true, force: true });
  }
  return Object.entries(samples).map(([name, s]) => summarize(name, s));
}

async function main(): Promise<void> {
  const args = process.argv.slice(2);
  const option = (name: string, fallback: number): number => {
    const at = args.indexOf(name);
    return at >= 0 ? Math.max(1, Math.min(10_000, Number(args[at + 1]) || fallback)) : fallback;
  };
  const n = option('--n', 200);
  const creates = option('--creates', 15);
  const json = args.includes('--json');
  const latency = await proxyLatency(n);
  const create = await createTimes(creates);
  const direct = latency[0]!;
  const viaConnect = latency[1]!;
  const addedMs = viaConnect.p50Ms - direct.p50Ms;
  const noNet = create[0]!;
  if (json) {
    console.log(JSON.stringify({ benchmark: 'egress', n, creates, latency, addedP50Ms: addedMs, create }, null, 2));
    return;
  }
  console.log(table(latency.map((s) => ({ request: s.name, n: s.n, 'p50 ms': s.p50Ms, 'p95 ms': s.p95Ms, 'added p50 ms': s.p50Ms - direct.p50Ms }))));
  console.log(`added p50 through the proxy: ${addedMs.toFixed(2)} ms (target <= 2 ms)\n`);
  console.log(table(create.map((s) => ({ 'sandbox create': s.name, n: s.n, 'p50 ms': s.p50Ms, 'p95 ms': s.p95Ms, 'p50 vs no network': `${(s.p50Ms / noNet.p50Ms).toFixed(2)}x` }))));
}

await main();
