import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { listSandboxCgroups } from '../../src/host/cgroups.host.js';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { newApiKey } from '../../src/store/index.js';
import { describeLeaks, findLeaks } from '../helpers/leaks.js';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';
import { waitFor } from './server-helpers.js';
import { alive, exited, isBuilt, ServedInstance } from './served.js';

/**
 * `capsule serve` (which supervises its sandboxes by default) as a child process, SIGKILLed while its sandboxes run, then started
 * again on the same data directory: the sandboxes kept running under their supervisors, the
 * processes are listed again by pid, output written while no server ran is readable, and a
 * supervisor or agent that dies ends only its own sandbox, with the reason. Runs on dist/.
 */

const dataDir = mkdtempSync(join(testDataDir(), 'sup-'));
const host = new HostEnvironment({ dataDir });
const apiKey = newApiKey();
const served = new ServedInstance(dataDir, apiKey);
const children = served.children;
const serve = (...extra: string[]) => served.serve(...extra);
const api = (url: string) => served.api(url);
const supervisorPid = (sandboxId: string) => served.supervisorPid(sandboxId);

/** The stdout a process's event log holds (NDJSON, base64 chunks), read until its exit when it ended. */
async function stdoutOf(url: string, sandboxId: string, pid: number): Promise<string> {
  const response = await fetch(`${url}/v1/sandboxes/${sandboxId}/processes/${pid}/events`, { headers: { authorization: `Bearer ${apiKey}` } });
  const lines = (await response.text()).split('\n').filter((l) => l !== '').map((l) => JSON.parse(l) as { type: string; data?: string });
  return lines.filter((e) => e.type === 'stdout').map((e) => Buffer.from(e.data ?? '', 'base64').toString()).join('');
}

/** The host pid of a sandbox's agent: the capsule-agent in its cgroup whose parent is bwrap. */
function agentPid(sandboxId: string): number {
  const procs = readFileSync(`/sys/fs/cgroup/unified/${host.cgroupPrefix}${sandboxId}/cgroup.procs`, 'utf8').split('\n').filter(Boolean).map(Number);
  for (const pid of procs) {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const match = /^\d+ \((.*)\) \S+ (\d+)/s.exec(stat);
    if (match?.[1] !== 'capsule-agent') continue;
    const parent = readFileSync(`/proc/${match[2]}/stat`, 'utf8');
    if (/^\d+ \(bwrap\)/.test(parent)) return pid;
  }
  throw new Error(`no agent in sandbox ${sandboxId}`);
}

const COUNTER = 'i=0; while :; do echo $i > /workspace/count; i=$((i+1)); sleep 0.05; done';
const WAITER = 'echo before; while [ ! -e /workspace/go ]; do sleep 0.05; done; echo "after-$(cat /workspace/go)"; exit 3';

afterEach(async () => {
  for (const child of children) {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGTERM');
      await exited(child);
    }
  }
});
afterAll(async () => {
  const leaks = describeLeaks(await findLeaks(dataDir));
  await host.volume.unmount().catch(() => undefined);
  rmSync(dataDir, { recursive: true, force: true });
  expect(leaks, 'host resources of the supervised instance left behind').toBe('');
  await expectNoLeaks();
});

describe('capsule serve (supervised by default): sandboxes outlive the server', () => {
  it.skipIf(!isBuilt)('keeps processes running through a SIGKILL and a SIGTERM stop of the server and reattaches to them by pid (needs npm run build)', async () => {
    const first = await serve();
    const call = api(first.url);
    const a = await call<{ sandboxId: string }>('POST', '/v1/sandboxes', { metadata: { sup: 'a' } });
    expect(a.status).toBe(201);
    const id = a.body.sandboxId;
    const counter = await call<{ pid: number }>('POST', `/v1/sandboxes/${id}/processes`, { argv: ['sh', '-c', COUNTER], background: true, tag: 'counter' });
    const waiter = await call<{ pid: number }>('POST', `/v1/sandboxes/${id}/processes`, { argv: ['sh', '-c', WAITER], background: true });
    const shell = await call<{ pid: number }>('POST', `/v1/sandboxes/${id}/processes`, { argv: ['sh'], background: true, pty: { cols: 80, rows: 24 } });
    for (const started of [counter, waiter, shell]) expect(started.status, JSON.stringify(started.body)).toBe(201);
    const countFile = join(host.volume.path(id), 'count');
    await waitFor(() => Promise.resolve(existsSync(countFile) ? true : undefined), { what: 'the counter writes' });
    const supervisor = supervisorPid(id);

    first.child.kill('SIGKILL');
    await exited(first.child);

    // No server: the sandbox runs on under its supervisor; what it writes now is spooled.
    expect(alive(supervisor)).toBe(true);
    const countAtCrash = Number(readFileSync(countFile, 'utf8'));
    await waitFor(() => Promise.resolve(Number(readFileSync(countFile, 'utf8')) > countAtCrash + 2 ? true : undefined), { what: 'counting while the server is down' });
    writeFileSync(join(host.volume.path(id), 'go'), 'while-down');
    const spool = join(dataDir, 'run', `${id}.spool`);
    await waitFor(() => Promise.resolve(existsSync(spool) && readFileSync(spool).includes('after-while-down') ? true : undefined), { what: 'output spooled while the server is down' });

    const second = await serve();
    const call2 = api(second.url);
    const record = await call2<{ state: string }>('GET', `/v1/sandboxes/${id}`);
    expect(record.body.state, JSON.stringify(record.body)).toBe('running');
    expect(supervisorPid(id)).toBe(supervisor);
    const listed = await call2<{ processes: { pid: number; running: boolean; argv: string[]; tag?: string }[] }>('GET', `/v1/sandboxes/${id}/processes`);
    const byPid = new Map(listed.body.processes.map((p) => [p.pid, p]));
    expect(byPid.get(counter.body.pid), JSON.stringify(listed.body)).toMatchObject({ running: true, argv: ['sh', '-c', COUNTER], tag: 'counter' });
    expect(byPid.get(shell.body.pid)).toMatchObject({ running: true, argv: ['sh'] });
    expect(byPid.get(waiter.body.pid)).toMatchObject({ running: false, argv: ['sh', '-c', WAITER] });
    // Written while no server ran: replayed from the spool, with the exit.
    expect(await stdoutOf(second.url, id, waiter.body.pid)).toContain('after-while-down');

    // Still counting; the pty shell takes input and answers through the new server.
    const countNow = Number(readFileSync(countFile, 'utf8'));
    await waitFor(() => Promise.resolve(Number(readFileSync(countFile, 'utf8')) > countNow ? true : undefined), { what: 'counting after the restart' });
    const input = await fetch(`${second.url}/v1/sandboxes/${id}/processes/${shell.body.pid}/stdin`, {
      method: 'POST',
      headers: { authorization: `Bearer ${apiKey}`, 'content-type': 'application/octet-stream' },
      body: 'echo pty-$((6*7)); exit\n',
    });
    expect(input.status).toBe(204);
    expect(await stdoutOf(second.url, id, shell.body.pid)).toContain('pty-42');

    // A SIGTERM stop leaves it running, says so, and the next start reattaches again.
    second.child.kill('SIGTERM');
    await exited(second.child);
    expect(second.child.exitCode, second.stderr()).toBe(0);
    expect(second.stderr()).toContain(`capsule: left 1 sandbox running (the next start reattaches): ${id}`);
    expect(alive(supervisor)).toBe(true);
    const countAtStop = Number(readFileSync(countFile, 'utf8'));
    await waitFor(() => Promise.resolve(Number(readFileSync(countFile, 'utf8')) > countAtStop ? true : undefined), { what: 'counting after a SIGTERM stop' });
    const third = await serve('--stop-sandboxes');
    const relisted = await api(third.url)<{ processes: { pid: number; running: boolean }[] }>('GET', `/v1/sandboxes/${id}/processes`);
    expect(relisted.body.processes.find((p) => p.pid === counter.body.pid)).toMatchObject({ running: true });

    // --stop-sandboxes: a stop ends every sandbox and supervisor.
    third.child.kill('SIGTERM');
    await exited(third.child);
    expect(third.child.exitCode, third.stderr()).toBe(0);
    expect(alive(supervisor)).toBe(false);
    expect(await listSandboxCgroups(host.cgroupPrefix)).toEqual([]);
    expect(readdirSync(join(dataDir, 'run'))).toEqual([]);
  });

  it.skipIf(!isBuilt)('keeps a paused sandbox paused through a SIGKILL and a SIGTERM stop, its processes frozen, and resumes them (needs npm run build)', async () => {
    const first = await serve();
    const call = api(first.url);
    const made = await call<{ sandboxId: string }>('POST', '/v1/sandboxes', { metadata: { sup: 'paused' } });
    expect(made.status).toBe(201);
    const id = made.body.sandboxId;
    const counter = await call<{ pid: number }>('POST', `/v1/sandboxes/${id}/processes`, { argv: ['sh', '-c', COUNTER], background: true });
    expect(counter.status).toBe(201);
    const countFile = join(host.volume.path(id), 'count');
    const count = () => Number(readFileSync(countFile, 'utf8'));
    await waitFor(() => Promise.resolve(existsSync(countFile) && count() > 1 ? true : undefined), { what: 'the counter writes' });
    const paused = await call<{ state: string; pause: { keepsMemory: boolean; survivesRestart: boolean } }>('POST', `/v1/sandboxes/${id}/pause`, { keepMemory: true });
    expect(paused.status, JSON.stringify(paused.body)).toBe(200);
    expect(paused.body.pause).toMatchObject({ keepsMemory: true, survivesRestart: true });
    const supervisor = supervisorPid(id);

    first.child.kill('SIGKILL');
    await exited(first.child);
    expect(alive(supervisor)).toBe(true);

    // Taken over still paused: the counter's process is there, frozen (it may have ticked once
    // while the agent thawed to answer the reattach, never after).
    const second = await serve();
    const call2 = api(second.url);
    const record = await call2<{ state: string }>('GET', `/v1/sandboxes/${id}`);
    expect(record.body.state, JSON.stringify(record.body)).toBe('paused');
    const frozenAt = count();
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect(count()).toBe(frozenAt);

    // A SIGTERM stop keeps it too, and lists it as left.
    second.child.kill('SIGTERM');
    await exited(second.child);
    expect(second.child.exitCode, second.stderr()).toBe(0);
    expect(second.stderr()).toContain(`capsule: left 1 sandbox running (the next start reattaches): ${id}`);
    expect(alive(supervisor)).toBe(true);

    const third = await serve('--stop-sandboxes');
    const call3 = api(third.url);
    expect((await call3<{ state: string }>('GET', `/v1/sandboxes/${id}`)).body.state).toBe('paused');
    const resumed = await call3<{ state: string }>('POST', `/v1/sandboxes/${id}/resume`);
    expect(resumed.status, JSON.stringify(resumed.body)).toBe(200);
    expect(resumed.body.state).toBe('running');
    const atResume = count();
    await waitFor(() => Promise.resolve(count() > atResume + 2 ? true : undefined), { what: 'the same counter counting after the resume' });
    const listed = await call3<{ processes: { pid: number; running: boolean }[] }>('GET', `/v1/sandboxes/${id}/processes`);
    expect(listed.body.processes.find((p) => p.pid === counter.body.pid)).toMatchObject({ running: true });

    third.child.kill('SIGTERM');
    await exited(third.child);
    expect(alive(supervisor)).toBe(false);
  });

  it.skipIf(!isBuilt)('ends a sandbox whose supervisor or agent dies with the reason, and only that one', async () => {
    const served = await serve('--stop-sandboxes');
    const call = api(served.url);
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) {
      const created = await call<{ sandboxId: string }>('POST', '/v1/sandboxes', {});
      expect(created.status).toBe(201);
      ids.push(created.body.sandboxId);
    }
    const [bystander, supervised, agented] = ids as [string, string, string];
    process.kill(supervisorPid(supervised), 'SIGKILL');
    process.kill(agentPid(agented), 'SIGKILL');
    const ended = async (id: string) => {
      const got = await call<{ state: string; endReason?: string }>('GET', `/v1/sandboxes/${id}`);
      return got.body.state === 'failed' ? got.body.endReason : undefined;
    };
    expect(await waitFor(() => ended(supervised), { what: 'the sandbox of the killed supervisor ends' })).toBe('crashed: supervisor gone');
    expect(await waitFor(() => ended(agented), { what: 'the sandbox of the killed agent ends' })).toBe('crashed: agent exited 137');
    const run = await call<{ pid: number }>('POST', `/v1/sandboxes/${bystander}/processes`, { argv: ['true'], background: true });
    expect(run.status).toBe(201);
    expect((await call<{ state: string }>('GET', `/v1/sandboxes/${bystander}`)).body.state).toBe('running');
    await waitFor(async () => ((await listSandboxCgroups(host.cgroupPrefix)).length === 1 ? true : undefined), { what: 'the dead sandboxes cleaned up' });
    await waitFor(() => Promise.resolve(readdirSync(join(dataDir, 'run')).every((name) => name.startsWith(bystander)) ? true : undefined), { what: 'their supervisor files removed' });
    served.child.kill('SIGTERM');
    await exited(served.child);
    expect(served.child.exitCode, served.stderr()).toBe(0);
  });
});
