import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { SandboxManager } from '../../src/engine/sandbox-manager.js';
import { MemoryRecordStore } from '../../src/store/index.js';
import { type EngineEvent } from '../../src/engine/events.js';
import type { ProcessEvent } from '../../src/engine/types.js';
import { isSandboxError } from '../../src/errors/index.js';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';
import { existsSync } from 'node:fs';
import { readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { execFileSync } from 'node:child_process';
import { writeFile } from 'node:fs/promises';
import { HOST_IMAGE, type TemplateCatalog } from '../../src/engine/templates.js';
import { miniTemplateLayer } from '../helpers/mini-template.js';

const T = 'tenant-a';
let engine: SandboxManager;
let dataDir: string;
const events: EngineEvent[] = [];

beforeAll(async () => {
  dataDir = testDataDir();
  engine = await SandboxManager.open({ dataDir, store: new MemoryRecordStore(), onEvent: (e) => events.push(e) });
});
afterAll(async () => {
  await engine.close();
  await expectNoLeaks();
});

async function collect(events: AsyncIterable<ProcessEvent>): Promise<ProcessEvent[]> {
  const all: ProcessEvent[] = [];
  for await (const e of events) all.push(e);
  return all;
}

function text(events: ProcessEvent[], stream: 'stdout' | 'stderr'): string {
  return Buffer.concat(events.flatMap((e) => (e.type === stream ? [e.data] : []))).toString();
}

/** The host pid of a sandbox's agent: the process in the sandbox's cgroups that runs capsule-agent. */
async function hostPidOfAgent(sandboxId: string): Promise<number> {
  for (const entry of await readdir('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    const [cmdline, cgroup] = await Promise.all([readFile(`/proc/${entry}/cmdline`, 'utf8').catch(() => ''), readFile(`/proc/${entry}/cgroup`, 'utf8').catch(() => '')]);
    if (cmdline === '/.capsule/capsule-agent\0' && cgroup.includes(sandboxId)) return Number(entry);
  }
  throw new Error(`no agent process found for ${sandboxId}`);
}

async function waitFor(check: () => boolean, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`condition not met within ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

describe('SandboxManager (durable sandboxes on real backends)', () => {
  afterEach(async () => {
    for (const s of engine.list({ tenantId: T, states: ['running'] })) await engine.kill(T, s.sandboxId);
  });

  it('creates, runs processes that share files and /tmp, and kills', async () => {
    const s = await engine.create({ tenantId: T, metadata: { job: 'csv' } });
    expect(s.state).toBe('running');
    const w = await engine.startProcess(T, s.sandboxId, { argv: ['sh', '-c', 'echo data > /workspace/a; echo t > /tmp/b'] });
    expect((await w.result).outcome).toBe('ok');
    const r = await engine.startProcess(T, s.sandboxId, { argv: ['cat', '/workspace/a', '/tmp/b'] });
    const evs = await collect(r.events());
    expect(evs[0]).toEqual({ type: 'start', pid: r.pid });
    expect(text(evs, 'stdout')).toBe('data\nt\n');
    expect(evs.at(-1)?.type).toBe('exit');
    expect(engine.list({ tenantId: T, metadata: { job: 'csv' } }).map((x) => x.sandboxId)).toEqual([s.sandboxId]);
    const killed = await engine.kill(T, s.sandboxId);
    expect(killed.state).toBe('killed');
    expect(killed.endReason).toBe('killed by request');
  });

  it('reattaches to a background process after it exited and still gets the exit', async () => {
    const s = await engine.create({ tenantId: T });
    const p = await engine.startProcess(T, s.sandboxId, { argv: ['sh', '-c', 'echo one; echo two >&2; exit 4'] });
    await p.result;
    const late = engine.getProcess(T, s.sandboxId, p.pid);
    const evs = await collect(late.events());
    expect(text(evs, 'stdout')).toBe('one\n');
    expect(text(evs, 'stderr')).toBe('two\n');
    const exit = evs.at(-1);
    expect(exit?.type === 'exit' && exit.result.exitCode).toBe(4);
    expect(engine.listProcesses(T, s.sandboxId).find((x) => x.pid === p.pid)?.running).toBe(false);
  });

  it('lets go of an ended sandbox and reads its processes back from their logs, as they were', async () => {
    const s = await engine.create({ tenantId: T, spec: { limits: { stdoutBytes: 4096 } } });
    const p = await engine.startProcess(T, s.sandboxId, { argv: ['sh', '-c', 'echo out; echo err >&2; head -c 10000 /dev/zero | tr "\\0" x; exit 3'], tag: 'job' });
    const before = await p.result;
    const quiet = await engine.startProcess(T, s.sandboxId, { argv: ['true'] });
    await quiet.result;
    const replayedBefore = await collect(engine.getProcess(T, s.sandboxId, p.pid).events());
    await engine.kill(T, s.sandboxId);
    // Out of memory once its processes' records are written: the engine no longer lists it.
    await waitFor(() => !engine.list({ tenantId: T }).some((x) => x.sandboxId === s.sandboxId), 20_000);
    expect(existsSync(join(dataDir, 'logs', s.sandboxId, 'processes.json'))).toBe(true);

    expect(engine.get(T, s.sandboxId)).toMatchObject({ state: 'killed', endReason: 'killed by request' });
    const listed = engine.listProcesses(T, s.sandboxId);
    expect(listed.map((x) => ({ pid: x.pid, running: x.running, tag: x.tag }))).toEqual([
      { pid: p.pid, running: false, tag: 'job' },
      { pid: quiet.pid, running: false, tag: undefined },
    ]);
    const late = engine.getProcess(T, s.sandboxId, p.pid);
    expect(await collect(late.events())).toEqual(replayedBefore);
    const after = await late.result;
    expect(after).toEqual(before);
    expect(after).toMatchObject({ exitCode: 3, stdoutTruncated: true, stdoutBytes: 4 + 10000, stderr: 'err\n' });
    expect((await engine.getProcess(T, s.sandboxId, quiet.pid).result).outcome).toBe('ok');
    expect(() => late.signal('SIGKILL')).toThrow(expect.objectContaining({ code: 'PROCESS_NOT_FOUND' }));
    expect(() => engine.getProcess(T, s.sandboxId, 999_999)).toThrow(expect.objectContaining({ code: 'PROCESS_NOT_FOUND' }));
    // Still scoped by tenant.
    expect(() => engine.get('tenant-b', s.sandboxId)).toThrow(expect.objectContaining({ code: 'SANDBOX_NOT_FOUND' }));
    expect(() => engine.listProcesses('tenant-b', s.sandboxId)).toThrow(expect.objectContaining({ code: 'SANDBOX_NOT_FOUND' }));
  });

  it('writes stdin, closes it, and signals', async () => {
    const s = await engine.create({ tenantId: T });
    const cat = await engine.startProcess(T, s.sandboxId, { argv: ['cat'], stdin: true });
    cat.writeStdin('hello ');
    cat.writeStdin('world');
    cat.closeStdin();
    const result = await cat.result;
    expect(result.stdout).toBe('hello world');
    const sleeper = await engine.startProcess(T, s.sandboxId, { argv: ['sleep', '60'] });
    sleeper.signal('SIGTERM');
    expect((await sleeper.result).signal).toBe('SIGTERM');
    expect(() => sleeper.writeStdin('x')).toThrow(expect.objectContaining({ code: 'PROCESS_NOT_FOUND' }));
  });

  it('ends a process past its timeout with the wall-clock limit', async () => {
    const s = await engine.create({ tenantId: T });
    const p = await engine.startProcess(T, s.sandboxId, { argv: ['sleep', '60'], timeoutMs: 300 });
    const result = await p.result;
    expect(result.outcome).toBe('limit_exceeded');
    expect(result.limit?.resource).toBe('wall_clock');
  });

  it('refuses a missing program with EXEC_FAILED and a foreign tenant with SANDBOX_NOT_FOUND', async () => {
    const s = await engine.create({ tenantId: T });
    await expect(engine.startProcess(T, s.sandboxId, { argv: ['/nope'] })).rejects.toMatchObject({ code: 'EXEC_FAILED' });
    expect(() => engine.get('tenant-b', s.sandboxId)).toThrow(expect.objectContaining({ code: 'SANDBOX_NOT_FOUND' }));
  });

  it('expires a sandbox at its TTL, keeps the record with the reason, and can shorten the TTL', async () => {
    const s = await engine.create({ tenantId: T, spec: { ttlMs: 60_000 } });
    engine.setTimeout(T, s.sandboxId, 300);
    await waitFor(() => events.some((e) => e.type === 'sandbox.expired' && e.sandbox.sandboxId === s.sandboxId), 30_000);
    const info = engine.get(T, s.sandboxId);
    expect(info.endReason).toBe('ttl expired');
    expect(info.state).toBe('expired');
    try {
      await engine.startProcess(T, s.sandboxId, { argv: ['true'] });
      expect.unreachable();
    } catch (error) {
      expect(isSandboxError(error, 'SANDBOX_NOT_RUNNING')).toBe(true);
    }
  });

  it('the agent is the sandbox\'s pid 1: sandbox code cannot kill it', async () => {
    const s = await engine.create({ tenantId: T });
    const p = await engine.startProcess(T, s.sandboxId, { argv: ['sh', '-c', 'tr "\\0" " " </proc/1/cmdline; echo; kill -9 1; kill -KILL -1; echo sent'] });
    const r = await p.result;
    expect(r.stdout.split('\n')[0]?.trim()).toBe('/.capsule/capsule-agent');
    // The kernel drops what the sandbox sends its init (no handler), so the agent still answers.
    const next = await engine.startProcess(T, s.sandboxId, { argv: ['echo', 'still here'] });
    expect((await next.result).stdout).toBe('still here\n');
    expect(engine.get(T, s.sandboxId).state).toBe('running');
  });

  it('marks a sandbox whose agent died as failed and cleans it up', async () => {
    const s = await engine.create({ tenantId: T });
    // Killed from the host (the sandbox cannot): the agent is the process of its cgroup running it.
    const agentPid = await hostPidOfAgent(s.sandboxId);
    process.kill(agentPid, 'SIGKILL');
    await waitFor(() => engine.get(T, s.sandboxId).state === 'failed', 30_000);
    expect(engine.get(T, s.sandboxId).endReason).toMatch(/^crashed/);
  });
});

describe('pause and resume (namespace backend: freeze)', () => {
  it('stops a counting process while paused and continues it after resume', async () => {
    const s = await engine.create({ tenantId: T });
    const counter = await engine.startProcess(T, s.sandboxId, {
      argv: ['sh', '-c', 'i=0; while true; do i=$((i+1)); echo $i > /workspace/n; sleep 0.02; done'],
    });
    const read = async (): Promise<number> => {
      const p = await engine.startProcess(T, s.sandboxId, { argv: ['cat', '/workspace/n'] });
      return Number((await p.result).stdout);
    };
    const workspace = new HostEnvironment({ dataDir: testDataDir() }).volume.path(s.sandboxId);
    await waitFor(() => existsSync(join(workspace, 'n')), 30_000);
    const paused = await engine.pause(T, s.sandboxId);
    // The kernel reports the whole group frozen, and the counter file stands still.
    const events = await readFile(join('/sys/fs/cgroup/unified', `${new HostEnvironment({ dataDir: testDataDir() }).cgroupPrefix}${s.sandboxId}`, 'cgroup.events'), 'utf8');
    expect(events).toMatch(/^frozen 1$/m);
    const whilePaused = await readFile(join(workspace, 'n'), 'utf8');
    expect(await readFile(join(workspace, 'n'), 'utf8')).toBe(whilePaused);
    expect(paused.state).toBe('paused');
    expect(paused.pause).toMatchObject({ keepsMemory: true, survivesRestart: false });
    await expect(engine.startProcess(T, s.sandboxId, { argv: ['true'] })).rejects.toMatchObject({ code: 'SANDBOX_NOT_RUNNING' });
    await expect(engine.pause(T, s.sandboxId)).rejects.toMatchObject({ code: 'CONFLICT' });
    expect((await engine.resume(T, s.sandboxId)).state).toBe('running');
    const first = await read();
    let later = first;
    // Polled: the counter moves every 20 ms once thawed; 30 s is a deadline only a failure reaches.
    const deadline = Date.now() + 30_000;
    while (later <= first && Date.now() < deadline) later = await read();
    expect(later).toBeGreaterThan(first);
    counter.signal('SIGKILL');
  });
});

describe('warm pool in the engine', () => {
  it("serves a template's warm sandbox only to creates whose template has the same layer, not the same name", async () => {
    // The operator pools the public `mini`; tenant-a has a template of its own named `mini`
    // (another layer): tenant-a's create must start on its own root, tenant-b's takes the warm one.
    const volume = new HostEnvironment({ dataDir: testDataDir() }).volume;
    const publicLayer = await miniTemplateLayer(volume);
    const ownLayer = join(volume.mountPoint, `layer-test-own-${process.pid}`);
    const work = `${ownLayer}.tmp`;
    execFileSync('btrfs', ['subvolume', 'snapshot', publicLayer, work]);
    await writeFile(join(work, 'etc/template-marker'), 'tenant-a\n');
    execFileSync('btrfs', ['subvolume', 'snapshot', '-r', work, ownLayer]);
    execFileSync('btrfs', ['subvolume', 'delete', work]);
    const catalog: TemplateCatalog = {
      defaultRef: 'host',
      resolve: (tenant, ref) =>
        ref === 'host'
          ? Promise.resolve(HOST_IMAGE)
          : Promise.resolve({ ref: 'mini:latest', layerDir: tenant === T ? ownLayer : publicLayer, env: {}, user: 'user', workdir: '/home/user' }),
    };
    const seen: EngineEvent[] = [];
    const pooled = await SandboxManager.open({ dataDir: testDataDir(), templates: catalog, warmPool: { mini: 1 }, onEvent: (e) => seen.push(e) });
    try {
      const [pool] = [...(pooled as unknown as { pools: Map<string, { size: number }> }).pools.values()];
      await waitFor(() => pool!.size === 1, 15_000);
      const marker = async (tenantId: string, sandboxId: string) => (await (await pooled.startProcess(tenantId, sandboxId, { argv: ['cat', '/etc/template-marker'] })).result).stdout;
      const own = await pooled.create({ tenantId: T, spec: { template: 'mini' } });
      expect(await marker(T, own.sandboxId)).toBe('tenant-a\n');
      const other = await pooled.create({ tenantId: 'tenant-b', spec: { template: 'mini' } });
      expect(await marker('tenant-b', other.sandboxId)).toBe('mini\n');
      expect(seen.filter((e) => e.type === 'sandbox.created').map((e) => e.poolWarm)).toEqual([false, true]);
    } finally {
      await pooled.close();
      execFileSync('btrfs', ['subvolume', 'delete', ownLayer]);
    }
  });

  it('creates from a warm sandbox when the spec allows, says so in the event, and leaves nothing at close', async () => {
    const seen: EngineEvent[] = [];
    const pooled = await SandboxManager.open({ dataDir: testDataDir(), warmPool: 1, onEvent: (e) => seen.push(e) });
    try {
      const pool = (pooled as unknown as { pools: Map<string, { size: number }> }).pools.get('host')!;
      await waitFor(() => pool.size === 1, 15_000);
      const s = await pooled.create({ tenantId: T, spec: { limits: { memoryBytes: 128 * 1024 * 1024 } } });
      expect(seen.find((e) => e.type === 'sandbox.created')?.poolWarm).toBe(true);
      const p = await pooled.startProcess(T, s.sandboxId, { argv: ['sh', '-c', 'ls /workspace | wc -l'] });
      expect((await p.result).stdout).toBe('0\n');
      // A networked or mounted spec never comes from the pool.
      await waitFor(() => pool.size === 1, 15_000);
      const cold = await pooled.create({ tenantId: T, spec: { limits: { tmpBytes: 8 * 1024 * 1024 } } });
      expect(seen.filter((e) => e.type === 'sandbox.created').map((e) => e.poolWarm)).toEqual([true, false]);
      expect(cold.state).toBe('running');
    } finally {
      await pooled.close();
    }
  });
});
