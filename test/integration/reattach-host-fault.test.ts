import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { SandboxManager } from '../../src/engine/sandbox-manager.js';
import type { EngineEvent } from '../../src/engine/events.js';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { destroyNetns, NetworkNames } from '../../src/host/netns-pool.host.js';
import { MemoryRecordStore } from '../../src/store/index.js';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';

/*
 * A supervised sandbox the restarted engine fails to take over for a reason of the host's (here
 * its network namespace was deleted while no engine ran) is not a crashed sandbox: it is
 * recovered on its files, as a sandbox without a supervisor is, and the reason is in its
 * `sandbox.recovered` event. Only a supervisor that is gone ends a sandbox. The proxy resolves
 * nothing (hostsOnly, no hosts) and denies by name: no packet leaves the machine.
 */
const T = 'tenant-a';
const dataDir = testDataDir();
const names = new NetworkNames(new HostEnvironment({ dataDir }).cgroupPrefix);
const store = new MemoryRecordStore();
afterEach(expectNoLeaks);

function open(events: EngineEvent[]): Promise<SandboxManager> {
  return SandboxManager.open({ dataDir, store, supervise: true, egress: { hosts: {}, log: () => undefined }, onEvent: (e) => events.push(e) });
}

function alive(pid: number): boolean {
  try {
    return !/^\d+ \(.*\) Z /s.test(readFileSync(`/proc/${pid}/stat`, 'utf8'));
  } catch {
    return false;
  }
}

async function stdout(engine: SandboxManager, sandboxId: string, script: string): Promise<string> {
  const result = await (await engine.startProcess(T, sandboxId, { argv: ['sh', '-c', script] })).result;
  expect(result.outcome, JSON.stringify(result)).toMatch(/^(ok|exit_nonzero)$/);
  return result.stdout;
}

describe('a reattach the host fails', () => {
  it('recovers a networked sandbox whose namespace is gone on its files, with the reason, instead of ending it', async () => {
    const first = await open([]);
    const { sandboxId } = await first.create({ tenantId: T, spec: { network: { mode: 'allowlist', allow: [] }, ttlMs: 600_000 } });
    expect(await stdout(first, sandboxId, 'echo kept > /workspace/note && echo written')).toBe('written\n');
    await first.startProcess(T, sandboxId, { argv: ['sleep', '600'], tag: 'sleeper' });
    const supervisor = Number(readFileSync(join(dataDir, 'run', `${sandboxId}.pid`), 'utf8'));
    let left: string[] = [];
    await first.close({ keepSandboxes: true, onLeftRunning: (ids) => (left = ids) });
    expect(left).toEqual([sandboxId]);

    // The host fault: the namespace the sandbox kept is deleted while no engine runs.
    const slots = join(dataDir, 'net', 'slots');
    const netns = readdirSync(slots).find((name) => readFileSync(join(slots, name), 'utf8').startsWith(`sandbox ${sandboxId}\n`));
    expect(netns, 'the slot file of the sandbox left running').toBeDefined();
    await destroyNetns(netns!, names.veth(names.slotOf(netns!)!));

    const events: EngineEvent[] = [];
    const second = await open(events);
    try {
      expect(second.get(T, sandboxId).state, JSON.stringify({ sandbox: second.get(T, sandboxId), events })).toBe('running');
      const recovered = events.find((e) => e.type === 'sandbox.recovered' && e.sandbox.sandboxId === sandboxId);
      expect(recovered?.reason).toMatch(new RegExp(`^could not reattach after the restart: the network namespace of sandbox ${sandboxId} is gone$`));
      expect(events.some((e) => e.type === 'sandbox.crashed')).toBe(false);
      // Not taken over: the old supervisor (and the sleeper under it) is gone, the files are kept.
      expect(alive(supervisor)).toBe(false);
      expect(second.listProcesses(T, sandboxId).some((p) => p.tag === 'sleeper')).toBe(false);
      expect(await stdout(second, sandboxId, 'cat /workspace/note')).toBe('kept\n');
      // On a new namespace, registered with the proxy under its recorded policy (allow nothing).
      const refused = await stdout(second, sandboxId, 'curl -s -x "$HTTP_PROXY" http://198.51.100.11/');
      expect(refused).toMatch(/^\{"code":"EGRESS_NOT_ALLOWED"/);
      expect((await second.kill(T, sandboxId)).state).toBe('killed');
    } finally {
      await second.close();
    }
  }, 180_000);
});
