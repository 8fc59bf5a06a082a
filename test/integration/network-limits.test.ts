import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { NamespaceBackend } from '../../src/backends/namespace/namespace-backend.host.js';
import { EgressNetwork } from '../../src/host/netns-network.host.js';
import { kernelConnectionCap } from '../../src/host/nftables.host.js';
import { baseEnv } from '../../src/host/sandbox-layout.js';
import { superviseExec } from '../../src/engine/supervise.js';
import { newSandboxId } from '../../src/engine/ids.js';
import { DEFAULT_MAXIMA, parseSpec } from '../../src/sandbox-spec/index.js';

/*
 * The kernel's backstop under the proxy's own limit (issue 11, finding 3): the host's nftables
 * refuse a sandbox's connections to the proxy past the operator's maximum plus a margin, before
 * the proxy accepts them. A real sandbox in a real network namespace; its only destination is the
 * proxy (no name is resolved, no packet leaves the machine).
 */
const OPERATOR_MAXIMUM = 8;
const host = new HostEnvironment({ dataDir: testDataDir() });
let network: EgressNetwork;
let backend: NamespaceBackend;

beforeAll(async () => {
  await host.ensure();
  // Long timeouts: the connections below stay idle on purpose while they are counted.
  network = new EgressNetwork({ host, poolSize: 1, hostsOnly: true, hosts: {}, maxConcurrentConnections: OPERATOR_MAXIMUM, timeouts: { handshakeTimeoutMs: 120_000 } });
  backend = new NamespaceBackend({ host, network });
});
afterAll(async () => {
  await backend?.close();
});
afterEach(async () => {
  await network.warm();
  await expectNoLeaks();
});

const CAP = kernelConnectionCap(OPERATOR_MAXIMUM);
const ATTEMPTS = CAP + 200;

/** Opens ATTEMPTS idle connections to the proxy; then, all closed, opens ten more (the count is given back). */
const SCRIPT = String.raw`
import json, os, socket, time
host, port = os.environ['HTTP_PROXY'][len('http://'):].rsplit(':', 1)
held, refused = [], 0
for _ in range(${ATTEMPTS}):
    s = socket.socket()
    try:
        s.connect((host, int(port)))
        held.append(s)
    except ConnectionRefusedError:
        refused += 1
        s.close()
for s in held:
    s.close()
again, deadline = 0, time.monotonic() + 20
while again < 10 and time.monotonic() < deadline:
    s = socket.socket()
    try:
        s.connect((host, int(port)))
        again += 1
    except ConnectionRefusedError:
        time.sleep(0.1)
    s.close()
print(json.dumps({'held': len(held), 'refused': refused, 'again': again}))
`;

describe('kernel backstop on connections to the proxy', () => {
  it(`refuses a sandbox's connections past ${CAP} in nftables, before the proxy accepts them, and gives the count back`, async () => {
    // A spec above the operator's maximum cannot come through the engine; built here to show
    // that the kernel bounds a sandbox even when the proxy's own limit would not.
    const maxima = { ...DEFAULT_MAXIMA, network: { maxConcurrentConnections: 65_536 } };
    const spec = parseSpec({ network: { mode: 'allowlist', maxConcurrentConnections: 65_536 }, limits: { openFiles: 8192, wallClockMs: 60_000 } }, maxima);
    const sandbox = await backend.create(spec, { id: newSandboxId() });
    try {
      const r = await superviseExec(sandbox, { argv: ['python3', '-c', SCRIPT], env: baseEnv(), cwd: '/workspace' }, { timeoutMs: 60_000 });
      const show = `sandbox ${sandbox.id}: ${JSON.stringify(r)}`;
      const result = JSON.parse(r.stdout) as { held: number; refused: number; again: number };
      expect(result.held, show).toBe(CAP);
      expect(result.refused, show).toBe(ATTEMPTS - CAP);
      expect(result.again, show).toBe(10);
      // The proxy never saw the refused ones: its own limit (65,536 here) was not reached.
      expect(network.stats(sandbox.id)).toMatchObject({ limitHits: 0, concurrencyLimitHits: 0 });
    } finally {
      await sandbox.destroy();
    }
  });
});
