import { existsSync, mkdtempSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { listSandboxCgroups } from '../../src/host/cgroups.host.js';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { listInstanceNetns, NetworkNames } from '../../src/host/netns-pool.host.js';
import { FAKE_ADDRESSES, FakeInternet } from '../integration/network-fake-internet.js';
import { newApiKey } from '../../src/store/index.js';
import { testDataDir } from '../helpers/sandbox.js';
import { waitFor } from './server-helpers.js';
import { alive, exited, isBuilt, ServedInstance } from './served.js';

/**
 * Sandboxes of every kind outlive `capsule serve`: with a network (its namespace kept, its
 * policy registered again, never looser than before the crash), with a volume, and on gVisor;
 * and the faults around them end only their own sandbox, with the reason: a killed runsc, an
 * unreadable database row. DNS is answered by the proxy from policy and denials come from the
 * proxy itself: no packet leaves the machine. Runs on dist/ (`npm run build`).
 */
const dataDir = mkdtempSync(join(testDataDir(), 'sup-kinds-'));
const host = new HostEnvironment({ dataDir });
const instance = new ServedInstance(dataDir, newApiKey());

afterEach(() => instance.stopAll());
afterAll(() => instance.tearDown());

const COUNTER = (file: string) => `i=0; while :; do echo $i > ${file}; i=$((i+1)); sleep 0.1; done`;
type Call = ReturnType<ServedInstance['api']>;
interface Info { sandboxId: string; state: string; endReason?: string }

async function create(call: Call, spec: Record<string, unknown>): Promise<string> {
  const created = await call<Info>('POST', '/v1/sandboxes', { spec: { ttlMs: 600_000, limits: { wallClockMs: 600_000 }, ...spec } });
  expect(created.status, JSON.stringify(created.body)).toBe(201);
  return created.body.sandboxId;
}

/** Runs `script` to its end and returns its stdout (NDJSON stream: the exit line has the result). */
async function sh(instanceUrl: string, sandboxId: string, script: string): Promise<{ exitCode: number | null; stdout: string }> {
  const response = await fetch(`${instanceUrl}/v1/sandboxes/${sandboxId}/processes`, {
    method: 'POST',
    headers: { authorization: `Bearer ${instance.apiKey}`, 'content-type': 'application/json' },
    body: JSON.stringify({ argv: ['sh', '-c', script] }),
  });
  const lines = (await response.text()).split('\n').filter((l) => l !== '').map((l) => JSON.parse(l) as { type: string; result?: { exitCode: number | null; stdout: string } });
  const exit = lines.find((l) => l.type === 'exit');
  if (!exit?.result) throw new Error(`no exit in ${JSON.stringify(lines)}`);
  return exit.result;
}

function counted(file: string): number {
  return existsSync(file) ? Number(readFileSync(file, 'utf8')) : -1;
}

async function countsPast(file: string, n: number, what: string): Promise<void> {
  await waitFor(() => Promise.resolve(counted(file) > n ? true : undefined), { timeoutMs: 60_000, what });
}

async function ended(call: Call, id: string): Promise<string | undefined> {
  const got = await call<Info>('GET', `/v1/sandboxes/${id}`);
  return got.body.state === 'failed' ? (got.body.endReason ?? '') : undefined;
}

describe('sandboxes of every kind outlive capsule serve', () => {
  it.skipIf(!isBuilt)('a networked, a volume and a gVisor sandbox keep running through a SIGKILL; the network policy is the recorded one after it (needs npm run build)', async () => {
    const first = await instance.serve();
    const call = instance.api(first.url);
    expect((await call('POST', '/v1/volumes', { name: 'vol', sizeBytes: 64 * 1024 * 1024 })).status).toBe(201);
    const net = await create(call, { network: { mode: 'allowlist', allow: ['allowed.test', 'other.test'] } });
    const vol = await create(call, { volumes: [{ name: 'vol', path: '/data' }] });
    const gv = await create(call, { backend: 'gvisor' });
    for (const [id, file] of [[net, '/workspace/count'], [vol, '/data/count'], [gv, '/workspace/count']] as const) {
      const started = await call('POST', `/v1/sandboxes/${id}/processes`, { argv: ['sh', '-c', COUNTER(file)], background: true, tag: 'counter' });
      expect(started.status, JSON.stringify(started.body)).toBe(201);
    }
    const netCount = join(host.volume.path(net), 'count');
    const gvCount = join(host.volume.path(gv), 'count');
    await countsPast(netCount, 1, 'the networked sandbox counts');
    await countsPast(gvCount, 1, 'the gVisor sandbox counts');
    expect(await sh(first.url, net, 'getent hosts other.test >/dev/null && echo resolved')).toMatchObject({ stdout: 'resolved\n' });
    // Tightened before the crash: the restarted server must not bring other.test back.
    const tightened = await call('PUT', `/v1/sandboxes/${net}/network`, { mode: 'allowlist', allow: ['allowed.test'] });
    expect(tightened.status, JSON.stringify(tightened.body)).toBe(200);
    expect((await sh(first.url, net, 'getent hosts other.test; echo rc=$?')).stdout).toBe('rc=2\n');

    first.child.kill('SIGKILL');
    await exited(first.child);
    for (const file of [netCount, gvCount]) {
      const atCrash = counted(file);
      await countsPast(file, atCrash + 3, `counting in ${file} while no server runs`);
    }

    const second = await instance.serve();
    const call2 = instance.api(second.url);
    for (const id of [net, vol, gv]) {
      const record = await call2<Info & { backend: string }>('GET', `/v1/sandboxes/${id}`);
      expect(record.body.state, JSON.stringify(record.body)).toBe('running');
      const listed = await call2<{ processes: { tag?: string; running: boolean }[] }>('GET', `/v1/sandboxes/${id}/processes`);
      expect(listed.body.processes.find((p) => p.tag === 'counter'), JSON.stringify(listed.body)).toMatchObject({ running: true });
    }
    // The recorded policy, registered with the new proxy: allowed.test only, denials by the proxy.
    const probe = await sh(second.url, net, 'getent hosts allowed.test >/dev/null && echo allowed; getent hosts other.test; echo rc=$?; curl -s -x "$HTTP_PROXY" http://other.test/');
    expect(probe.stdout).toMatch(/^allowed\nrc=2\n\{"code":"EGRESS_NOT_ALLOWED"/);
    // The volume is still written by its sandbox; the gVisor one still counts.
    const before = Number((await sh(second.url, vol, 'cat /data/count')).stdout);
    await waitFor(async () => (Number((await sh(second.url, vol, 'cat /data/count')).stdout) > before ? true : undefined), { what: 'the volume counter after the restart' });
    await countsPast(gvCount, counted(gvCount), 'the gVisor sandbox counts after the restart');
    for (const id of [net, vol, gv]) expect((await call2('DELETE', `/v1/sandboxes/${id}`)).status).toBe(200);
    expect((await call2('DELETE', '/v1/volumes/vol')).status).toBe(204);
    second.child.kill('SIGTERM');
    await exited(second.child);
    expect(second.child.exitCode, second.stderr()).toBe(0);
    expect(await listSandboxCgroups(host.cgroupPrefix)).toEqual([]);
  }, 300_000);

  it.skipIf(!isBuilt)('a SIGTERM stop keeps the network of the networked sandboxes it leaves running: after the restart they run their process under the same egress policy (needs npm run build)', async () => {
    // The only destinations: the fake internet, in a namespace this test makes (198.51.100.0/24).
    const fake = new FakeInternet(new NetworkNames(host.cgroupPrefix));
    await fake.start();
    try {
      const [allowed, other] = FAKE_ADDRESSES;
      const policy = { network: { mode: 'allowlist', allow: [`${allowed}/32`] } };
      const first = await instance.serve();
      const call = instance.api(first.url);
      const net = await create(call, policy);
      const gv = await create(call, { backend: 'gvisor', ...policy });
      for (const id of [net, gv]) {
        const started = await call('POST', `/v1/sandboxes/${id}/processes`, { argv: ['sh', '-c', COUNTER('/workspace/count')], background: true, tag: 'counter' });
        expect(started.status, JSON.stringify(started.body)).toBe(201);
      }
      const counts = [net, gv].map((id) => join(host.volume.path(id), 'count'));
      for (const file of counts) await countsPast(file, 1, `counting in ${file}`);
      const PROBE = `curl -sS -x "$HTTP_PROXY" http://${allowed}/; curl -s -x "$HTTP_PROXY" http://${other}/`;
      const enforced = new RegExp(`^hello from ${allowed.replace(/\./g, '\\.')} via ${allowed.replace(/\./g, '\\.')}\n\{"code":"EGRESS_NOT_ALLOWED"`);
      for (const id of [net, gv]) expect((await sh(first.url, id, PROBE)).stdout).toMatch(enforced);
      const netnsBefore = await listInstanceNetns(new NetworkNames(host.cgroupPrefix));

      first.child.kill('SIGTERM');
      await exited(first.child);
      expect(first.child.exitCode, first.stderr()).toBe(0);
      expect(first.stderr()).toMatch(new RegExp(`left 2 sandboxes running.*(${net}.*${gv}|${gv}.*${net})`));
      // Their namespaces (with the slot files naming them) are still there; the pool's went.
      const kept = await listInstanceNetns(new NetworkNames(host.cgroupPrefix));
      expect(kept.length, `${kept.join(' ')} of ${netnsBefore.join(' ')}`).toBe(2);
      expect(kept.every((name) => netnsBefore.includes(name))).toBe(true);
      const owners = kept.map((name) => readFileSync(join(dataDir, 'net', 'slots', name), 'utf8').split('\n')[0]).sort();
      expect(owners).toEqual([`sandbox ${net}`, `sandbox ${gv}`].sort());
      for (const file of counts) {
        const atStop = counted(file);
        await countsPast(file, atStop + 3, `counting in ${file} while no server runs`);
      }

      const second = await instance.serve();
      const call2 = instance.api(second.url);
      for (const id of [net, gv]) {
        const record = await call2<Info>('GET', `/v1/sandboxes/${id}`);
        expect(record.body.state, JSON.stringify(record.body)).toBe('running');
        const listed = await call2<{ processes: { tag?: string; running: boolean }[] }>('GET', `/v1/sandboxes/${id}/processes`);
        expect(listed.body.processes.find((p) => p.tag === 'counter'), JSON.stringify(listed.body)).toMatchObject({ running: true });
        // Exactly the policy before the stop: the allowed address answers, the other is refused by the proxy.
        expect((await sh(second.url, id, PROBE)).stdout).toMatch(enforced);
      }
      for (const file of counts) await countsPast(file, counted(file), `counting in ${file} after the restart`);
      for (const id of [net, gv]) expect((await call2('DELETE', `/v1/sandboxes/${id}`)).status).toBe(200);
      second.child.kill('SIGTERM');
      await exited(second.child);
      expect(second.child.exitCode, second.stderr()).toBe(0);
    } finally {
      await fake.stop();
    }
  }, 300_000);

  it.skipIf(!isBuilt)('a stop keeps a gVisor sandbox paused to disk, and the next start resumes it with its process (needs npm run build)', async () => {
    const first = await instance.serve();
    const call = instance.api(first.url);
    const gv = await create(call, { backend: 'gvisor' });
    const started = await call<{ pid: number }>('POST', `/v1/sandboxes/${gv}/processes`, { argv: ['sh', '-c', COUNTER('/workspace/count')], background: true });
    expect(started.status).toBe(201);
    const file = join(host.volume.path(gv), 'count');
    await countsPast(file, 1, 'the gVisor sandbox counts');
    const paused = await call<{ state: string }>('POST', `/v1/sandboxes/${gv}/pause`, { keepMemory: true });
    expect(paused.body.state, JSON.stringify(paused.body)).toBe('paused');
    first.child.kill('SIGTERM');
    await exited(first.child);
    expect(first.stderr()).toContain(gv);

    const second = await instance.serve();
    const call2 = instance.api(second.url);
    expect((await call2<Info>('GET', `/v1/sandboxes/${gv}`)).body.state).toBe('paused');
    const atResume = counted(file);
    expect((await call2<Info>('POST', `/v1/sandboxes/${gv}/resume`, {})).body.state).toBe('running');
    await countsPast(file, atResume, 'the restored counter counts on');
    expect((await call2('DELETE', `/v1/sandboxes/${gv}`)).status).toBe(200);
  }, 180_000);

  it.skipIf(!isBuilt)('a killed runsc ends its gVisor sandbox with the reason; the other sandboxes run on (needs npm run build)', async () => {
    const served = await instance.serve();
    const call = instance.api(served.url);
    const gv = await create(call, { backend: 'gvisor' });
    const bystander = await create(call, { backend: 'gvisor' });
    const sentry = readFileSync(`/sys/fs/cgroup/unified/${host.cgroupPrefix}${gv}/cgroup.procs`, 'utf8')
      .split('\n').filter(Boolean).map(Number)
      .find((pid) => readFileSync(`/proc/${pid}/cmdline`, 'utf8').startsWith('runsc-sandbox\0'));
    expect(sentry, 'the runsc-sandbox (sentry) process of the sandbox').toBeDefined();
    process.kill(sentry!, 'SIGKILL');
    expect(await waitFor(() => ended(call, gv), { what: 'the sandbox of the killed runsc ends' })).toMatch(/^crashed: runsc exited \d+$/);
    expect((await sh(served.url, bystander, 'echo fine')).stdout).toBe('fine\n');
    await waitFor(async () => ((await listSandboxCgroups(host.cgroupPrefix)).length === 1 ? true : undefined), { what: 'the dead sandbox cleaned up' });
    expect((await call('DELETE', `/v1/sandboxes/${bystander}`)).status).toBe(200);
  }, 180_000);

  it.skipIf(!isBuilt)('an unreadable database row ends only that sandbox, with the reason; the others are reattached (needs npm run build)', async () => {
    const first = await instance.serve();
    const call = instance.api(first.url);
    const broken = await create(call, {});
    const kept = await create(call, {});
    for (const id of [broken, kept]) {
      expect((await call('POST', `/v1/sandboxes/${id}/processes`, { argv: ['sh', '-c', COUNTER('/workspace/count')], background: true })).status).toBe(201);
    }
    const brokenSupervisor = instance.supervisorPid(broken);
    first.child.kill('SIGTERM');
    await exited(first.child);
    const db = new Database(join(dataDir, 'capsule.db'));
    db.prepare('UPDATE sandboxes SET info = ? WHERE sandbox_id = ?').run('{"sandboxId": "half a rec', broken);
    db.close();

    const second = await instance.serve();
    const call2 = instance.api(second.url);
    const record = await call2<Info>('GET', `/v1/sandboxes/${broken}`);
    expect(record.body).toMatchObject({ state: 'failed', endReason: expect.stringMatching(/^crashed: its stored record was unreadable after a restart \(not JSON/) as unknown });
    expect(alive(brokenSupervisor)).toBe(false);
    expect((await call2<Info>('GET', `/v1/sandboxes/${kept}`)).body.state).toBe('running');
    const keptCount = join(host.volume.path(kept), 'count');
    await countsPast(keptCount, counted(keptCount), 'the other sandbox counts on');
    expect(await listSandboxCgroups(host.cgroupPrefix)).toEqual([`${host.cgroupPrefix}${kept}`]);
    expect(readdirSync(join(dataDir, 'run')).every((name) => name.startsWith(kept))).toBe(true);
    expect((await call2('DELETE', `/v1/sandboxes/${kept}`)).status).toBe(200);
  }, 180_000);
});
