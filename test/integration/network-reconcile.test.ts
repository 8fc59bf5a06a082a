import { afterEach, describe, expect, it } from 'vitest';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { NamespaceBackend } from '../../src/backends/namespace/namespace-backend.host.js';
import { EgressNetwork } from '../../src/host/netns-network.host.js';
import { listInstanceLinks, listInstanceNetns, NetworkNames } from '../../src/host/netns-pool.host.js';
import { listTables } from '../../src/host/nftables.host.js';
import { newSandboxId } from '../../src/engine/ids.js';
import { parseSpec } from '../../src/sandbox-spec/index.js';
import { assertEnforceable } from '../../src/engine/capabilities.js';

const host = new HostEnvironment({ dataDir: testDataDir() });
const names = new NetworkNames(host.cgroupPrefix);
const spec = parseSpec({ network: { mode: 'allowlist', allow: [] } });
afterEach(expectNoLeaks);

async function hostState(): Promise<{ netns: string[]; links: string[]; tables: number }> {
  return { netns: await listInstanceNetns(names), links: await listInstanceLinks(names), tables: (await listTables(names.table)).length };
}

describe('network teardown and reconcile', () => {
  it('destroy removes the namespace and veth at once; close removes pool, rules and anchor', async () => {
    const network = new EgressNetwork({ host, poolSize: 1, hostsOnly: true, log: () => undefined });
    const backend = new NamespaceBackend({ host, network });
    const probe = await backend.probe();
    expect(probe.capabilities).toEqual(expect.arrayContaining(['network.none', 'network.allowlist', 'network.internet']));
    expect(() => assertEnforceable(spec, probe)).not.toThrow();
    const sandbox = await backend.create(spec, { id: newSandboxId() });
    await network.warm();
    const during = await hostState();
    expect(during.netns.length).toBe(2); // the sandbox's and one ready in the pool
    expect(during.links).toEqual(expect.arrayContaining([...names.anchor]));
    expect(during.tables).toBe(1);
    await sandbox.destroy();
    expect((await hostState()).netns.length).toBe(1);
    await backend.close();
    expect(await hostState()).toEqual({ netns: [], links: [], tables: 0 });
  });

  it('a crash-restart: a new backend reconciles away the dropped sandbox, its namespace, veth, rules and anchor', async () => {
    const crashed = new EgressNetwork({ host, poolSize: 1, hostsOnly: true, log: () => undefined });
    const dropped = new NamespaceBackend({ host, network: crashed });
    const id = newSandboxId();
    const sandbox = await dropped.create(spec, { id });
    await crashed.warm();
    await crashed.proxy.close(); // what dies with the process; namespaces, veths and rules stay
    expect((await hostState()).netns.length).toBe(2);

    const restarted = new NamespaceBackend({ host });
    const report = await restarted.reconcile(new Set());
    expect(report.failures).toEqual([]);
    expect(report.removed).toEqual(expect.arrayContaining([`cgroup:${id}`, `workspace:${id}`, `network:${names.table}`]));
    expect(report.removed.filter((r) => r.startsWith('netns:')).length).toBe(2);
    expect(await hostState()).toEqual({ netns: [], links: [], tables: 0 });
    await sandbox.destroy().catch(() => undefined); // reaps the launcher; everything else is gone already
  });

  it('network reconcile keeps the namespaces of live ids and of its own pool', async () => {
    const network = new EgressNetwork({ host, poolSize: 1, hostsOnly: true, log: () => undefined });
    const backend = new NamespaceBackend({ host, network });
    const sandbox = await backend.create(spec, { id: newSandboxId() });
    try {
      await network.warm();
      const before = await hostState();
      // (The backend's reconcile also ends every process of an earlier server; the network part
      // keeps what a live id or this process's pool holds.)
      const report = await EgressNetwork.reconcile(host, new Set([sandbox.id]), network);
      expect(report).toEqual({ removed: [], failures: [] });
      expect(await hostState()).toEqual(before);
    } finally {
      await sandbox.destroy();
      await backend.close();
    }
  });
});

describe('a process that exits without closing its network (one-shot runs)', () => {
  it('leaves only its ready namespaces, and the next start of the instance deletes them', async () => {
    const first = new EgressNetwork({ host, poolSize: 2, hostsOnly: true, log: () => undefined });
    await first.warm();
    await first.proxy.close(); // the process ends: listeners go, host objects stay
    expect((await hostState()).netns.length).toBe(2);
    const next = new EgressNetwork({ host, poolSize: 1, hostsOnly: true, log: () => undefined });
    try {
      await next.warm();
      const state = await hostState();
      expect(state.netns.length).toBe(1); // the two stale ones are gone, one new one is ready
      expect(next.owns(state.netns[0]!)).toBe(true);
    } finally {
      await next.close();
    }
    expect(await hostState()).toEqual({ netns: [], links: [], tables: 0 });
  });
});
