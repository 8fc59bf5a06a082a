import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { expectNoLeaks } from '../helpers/sandbox.js';
import { request } from 'node:http';
import { connect as tlsConnect } from 'node:tls';
import { createSocket } from 'node:dgram';
import { EgressProxy, type EgressEvent } from '../../src/host/egress/egress-proxy.js';
import { parseSpec } from '../../src/sandbox-spec/index.js';

/*
 * The proxy alone, on 127.0.0.1 with free ports; this test process plays the sandbox (its source
 * address 127.0.0.1 is registered). It exercises the production resolver (dns.lookup of
 * "localhost", answered from /etc/hosts: no query leaves the machine) next to the hosts override.
 */
const events: EgressEvent[] = [];
const proxy = new EgressProxy({
  address: '127.0.0.1',
  ports: { proxy: 0, http: 0, tls: 0, dns: 0 },
  hosts: { 'internal.test': ['10.0.0.1'] },
  log: (e) => events.push(e),
});

beforeAll(async () => {
  await proxy.start();
  proxy.register('proxytest', '127.0.0.1', parseSpec({ network: { mode: 'internet' } }).network);
});
afterAll(() => proxy.close());
afterEach(expectNoLeaks);

function get(port: number, path: string, headers: Record<string, string> = {}): Promise<{ status: number; body: { code: string; rule: string } }> {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, path, headers }, (res) => {
      let text = '';
      res.on('data', (chunk: Buffer) => (text += chunk.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: JSON.parse(text) as { code: string; rule: string } }));
    });
    req.on('error', reject);
    req.end();
  });
}

describe('egress proxy decisions on resolved addresses', () => {
  it('resolves with the system resolver (dns.lookup) and denies a name that lands on loopback', async () => {
    const r = await get(proxy.ports.proxy, 'http://localhost:9/x');
    expect(r.status).toBe(403);
    expect(r.body).toMatchObject({ code: 'EGRESS_FORBIDDEN_ADDRESS', rule: 'always-deny:loopback' });
  });

  it('consults the operator hosts override before the system resolver', async () => {
    const r = await get(proxy.ports.http, '/x', { host: 'internal.test' });
    expect(r.body).toMatchObject({ code: 'EGRESS_FORBIDDEN_ADDRESS', rule: 'always-deny:private-10' });
  });

  it('reads the SNI of a redirected TLS connection and resets a denied one', async () => {
    const before = events.length;
    const error = await new Promise<Error>((resolve) => {
      const socket = tlsConnect({ host: '127.0.0.1', port: proxy.ports.tls, servername: 'localhost', rejectUnauthorized: false });
      socket.once('error', resolve);
      socket.once('secureConnect', () => resolve(new Error('connected')));
    });
    expect(error.message).toMatch(/ECONNRESET|socket hang up|disconnected/);
    expect(events.slice(before)).toEqual([expect.objectContaining({ protocol: 'tls', destination: 'localhost:443', rule: 'always-deny:loopback' })]);
    expect(proxy.stats('proxytest')?.blocked).toBeGreaterThanOrEqual(3);
  });

  it('answers DNS from policy only: allowed names get the proxy address, others NXDOMAIN', async () => {
    proxy.update('proxytest', parseSpec({ network: { mode: 'allowlist', allow: ['example.com'] } }).network);
    const ask = (name: string): Promise<Buffer> => new Promise((resolve) => {
      const socket = createSocket('udp4');
      const labels = name.split('.').map((l) => Buffer.concat([Buffer.from([l.length]), Buffer.from(l)]));
      socket.once('message', (reply) => {
        socket.close();
        resolve(reply);
      });
      socket.send(Buffer.concat([Buffer.from([0, 7, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0]), ...labels, Buffer.from([0, 0, 1, 0, 1])]), proxy.ports.dns, '127.0.0.1');
    });
    const allowed = await ask('example.com');
    expect(allowed[3]! & 0xf).toBe(0);
    expect([...allowed.subarray(allowed.length - 4)]).toEqual([127, 0, 0, 1]);
    const denied = await ask('leak-1234.example.org');
    expect(denied[3]! & 0xf).toBe(3);
    expect(events.at(-1)).toMatchObject({ protocol: 'dns', destination: 'leak-1234.example.org', rule: 'dns-allowlist' });
  });
});
