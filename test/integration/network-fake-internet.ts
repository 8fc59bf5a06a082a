import { spawn, spawnSync } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import type { NetworkNames } from '../../src/host/netns-pool.host.js';

/**
 * A "fake internet" for network tests, entirely on this machine: a network namespace the test
 * makes, holding 198.51.100.10 and .11 (TEST-NET-2) with HTTP (80), HTTPS (443, a self-signed
 * certificate for allowed.test/other.test), a TCP echo on 7000 and a UDP counter on 9999. The
 * host routes 198.51.100.0/24 into it, so no packet to those addresses ever leaves the box.
 */
export const FAKE_ADDRESSES = ['198.51.100.10', '198.51.100.11'] as const;
const HOST_SIDE = '203.0.113.1';

const SERVER = String.raw`
const http = require('node:http'); const https = require('node:https'); const net = require('node:net');
const dgram = require('node:dgram'); const fs = require('node:fs');
const [cert, key] = [fs.readFileSync(process.argv[2]), fs.readFileSync(process.argv[3])];
let udpPackets = 0;
const handler = (req, res) => {
  const url = new URL(req.url, 'http://' + (req.headers.host || 'x'));
  if (url.pathname === '/udp-count') return res.end(String(udpPackets));
  if (url.pathname === '/echo') return res.end(JSON.stringify({ method: req.method, url: req.url, headers: req.headers }));
  res.end('hello from ' + (req.headers.host || '?') + ' via ' + req.socket.localAddress + '\n');
};
const ready = [];
for (const ip of ['198.51.100.10', '198.51.100.11']) {
  ready.push(new Promise((r) => http.createServer(handler).listen(80, ip, r)));
  ready.push(new Promise((r) => https.createServer({ cert, key }, handler).listen(443, ip, r)));
  ready.push(new Promise((r) => net.createServer((s) => s.pipe(s)).listen(7000, ip, r)));
  const udp = dgram.createSocket('udp4'); udp.on('message', () => udpPackets++);
  ready.push(new Promise((r) => udp.bind(9999, ip, r)));
}
Promise.all(ready).then(() => console.log(String(process.pid)));
// When the test process is gone (even killed), we go too.
const owner = Number(process.argv[4]);
setInterval(() => { try { process.kill(owner, 0); } catch { process.exit(0); } }, 500);
`;

export class FakeInternet {
  readonly netns: string;
  readonly link: string;
  /** PEM of the self-signed certificate (clients in sandboxes trust it explicitly). */
  certPem = '';
  keyPem = '';
  certFile = '';
  private pid: number | undefined;
  private dir = '';

  /** Named apart from the instance's own objects (the leak check must not count it). */
  constructor(names: NetworkNames) {
    const hex = names.linkPrefix.slice(2);
    this.netns = `capsule-fake-${hex}`;
    this.link = `cf${hex}x`;
  }

  async start(): Promise<void> {
    this.dir = await mkdtemp(join(tmpdir(), 'capsule-fake-'));
    const [certFile, keyFile, script] = ['cert.pem', 'key.pem', 'server.cjs'].map((f) => join(this.dir, f)) as [string, string, string];
    run(['openssl', 'req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-days', '2',
      '-subj', '/CN=allowed.test', '-addext', 'subjectAltName=DNS:allowed.test,DNS:other.test,DNS:www.allowed.test,IP:127.0.0.1',
      '-keyout', keyFile, '-out', certFile]);
    this.certPem = spawnSync('cat', [certFile]).stdout.toString();
    this.keyPem = spawnSync('cat', [keyFile]).stdout.toString();
    this.certFile = certFile;
    await writeFile(script, SERVER);
    // Leftovers of an interrupted run with the same names would make the route or link clash.
    spawnSync('ip', ['link', 'del', this.link]);
    spawnSync('ip', ['netns', 'del', this.netns]);
    spawnSync('ip', ['route', 'del', '198.51.100.0/24']);
    run(['ip', 'netns', 'add', this.netns]);
    run(['ip', '-b', '-'], `link add ${this.link} type veth peer name eth0 netns ${this.netns}\naddr add ${HOST_SIDE}/32 dev ${this.link}\nlink set ${this.link} up\n`);
    run(['ip', '-n', this.netns, '-b', '-'],
      `link set lo up\naddr add ${FAKE_ADDRESSES[0]}/24 dev eth0\naddr add ${FAKE_ADDRESSES[1]}/24 dev eth0\nlink set eth0 up\nroute add ${HOST_SIDE}/32 dev eth0\nroute add default via ${HOST_SIDE} dev eth0 onlink\n`);
    run(['ip', 'route', 'add', '198.51.100.0/24', 'dev', this.link, 'src', HOST_SIDE]);
    // setsid --fork: the server is not a descendant of the test process (the leak check counts
    // those); it is ended by its pid in stop().
    const child = spawn('setsid', ['--fork', 'nsenter', `--net=/run/netns/${this.netns}`, process.execPath, script, certFile, keyFile, String(process.pid)], {
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    const line = await new Promise<string>((resolve, reject) => {
      createInterface({ input: child.stdout }).once('line', resolve);
      child.stdout.once('end', () => reject(new Error('the fake internet did not start')));
    });
    this.pid = Number(line);
    child.stdout.destroy();
  }

  /** Packets the UDP counter received (read over HTTP from the host). */
  async udpPackets(): Promise<number> {
    const res = await fetch(`http://${FAKE_ADDRESSES[0]}/udp-count`);
    return Number(await res.text());
  }

  async stop(): Promise<void> {
    if (this.pid !== undefined) {
      process.kill(this.pid, 'SIGKILL');
      for (let i = 0; i < 400 && isAlive(this.pid); i++) await new Promise((resolve) => setTimeout(resolve, 5));
    }
    spawnSync('ip', ['link', 'del', this.link]); // synchronous, unlike the namespace's own teardown
    spawnSync('ip', ['netns', 'del', this.netns]);
    if (this.dir) await rm(this.dir, { recursive: true, force: true });
  }
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

function run(argv: string[], input?: string): void {
  const [file = '', ...args] = argv;
  const result = spawnSync(file, args, { input, stdio: ['pipe', 'pipe', 'pipe'] });
  if (result.status !== 0) throw new Error(`${argv.join(' ')} failed: ${result.stderr.toString()}`);
}
