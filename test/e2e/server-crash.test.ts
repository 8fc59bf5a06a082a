import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { join, resolve } from 'node:path';
import Database from 'better-sqlite3';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { listSandboxCgroups } from '../../src/host/cgroups.host.js';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { newApiKey } from '../../src/store/index.js';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';
import { waitFor } from './server-helpers.js';
import { exited, isBuilt, ServedInstance } from './served.js';

/**
 * `capsule serve --no-supervise` (sandboxes tied to the server process, the old model) as a
 * child process, SIGKILLed with sandboxes and a stream running, then
 * restarted on the same data directory. Runs on dist/: `npm run build` first.
 */
const ROOT = resolve(import.meta.dirname, '../..');
const BIN = join(ROOT, 'bin/capsule.js');

const dataDir = mkdtempSync(join(testDataDir(), 'crash-'));
const host = new HostEnvironment({ dataDir });
const apiKey = newApiKey();
const served = new ServedInstance(dataDir, apiKey);
const children = served.children;
const serve = () => served.serve('--no-supervise');
const api = (url: string) => served.api(url);

/** Sandbox ids whose cgroups exist, and processes of this data dir's sandboxes (from /proc/PID/cgroup). */
async function hostState(): Promise<{ cgroups: string[]; processIds: Set<string>; workspaces: string[] }> {
  const cgroups = (await listSandboxCgroups(host.cgroupPrefix)).map((name) => name.slice(host.cgroupPrefix.length));
  const processIds = new Set<string>();
  for (const pid of readdirSync('/proc').filter((e) => /^\d+$/.test(e))) {
    let text = '';
    try {
      text = readFileSync(`/proc/${pid}/cgroup`, 'utf8');
    } catch {
      continue;
    }
    const match = new RegExp(`${host.cgroupPrefix}([a-z2-7]{20})`).exec(text);
    if (match?.[1]) processIds.add(match[1]);
  }
  const workspaces = existsSync(host.volume.mountPoint) ? readdirSync(host.volume.mountPoint).filter((e) => e.startsWith('ws-')).map((e) => e.slice(3)) : [];
  return { cgroups, processIds, workspaces };
}

function auditVerify(): { status: number | null; result: { ok: boolean; badSeq?: number; records: number } } {
  const run = spawnSync(process.execPath, [BIN, 'audit', 'verify', '--data-dir', dataDir, '--json'], { encoding: 'utf8' });
  return { status: run.status, result: JSON.parse(run.stdout) as { ok: boolean; badSeq?: number; records: number } };
}

afterEach(async () => {
  for (const child of children) {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGTERM');
      await exited(child);
    }
  }
});
afterAll(async () => {
  // The crash server's data dir is its own Capsule instance: its volume is ours to remove.
  await host.volume.unmount().catch(() => undefined);
  rmSync(dataDir, { recursive: true, force: true });
  await expectNoLeaks();
});

describe('capsule serve after a crash', () => {
  it.skipIf(!isBuilt)('restarts on the same data dir with no leaks, no lost records and a valid audit chain (needs npm run build)', async () => {
    const first = await serve();
    const call = api(first.url);
    const a = await call<{ sandboxId: string }>('POST', '/v1/sandboxes', { metadata: { crash: 'a' } });
    const b = await call<{ sandboxId: string }>('POST', '/v1/sandboxes', { metadata: { crash: 'b' } });
    expect(a.status).toBe(201);
    expect(b.status).toBe(201);
    const put = await fetch(`${first.url}/v1/sandboxes/${a.body.sandboxId}/files?path=kept.txt`, {
      method: 'PUT',
      headers: { authorization: `Bearer ${apiKey}`, 'content-type': 'application/octet-stream' },
      body: 'still here',
    });
    expect(put.status).toBe(200);
    // A foreground exec streaming when the server dies.
    const streaming = await fetch(`${first.url}/v1/sandboxes/${b.body.sandboxId}/processes`, {
      method: 'POST',
      headers: { authorization: `Bearer ${apiKey}`, 'content-type': 'application/json', 'idempotency-key': 'exec-at-crash' },
      body: JSON.stringify({ argv: ['sh', '-c', 'echo started; sleep 30'] }),
    });
    const reader = streaming.body!.getReader();
    expect(new TextDecoder().decode((await reader.read()).value as Uint8Array)).toContain('"start"');
    const before = await hostState();
    expect(before.cgroups.sort()).toEqual([a.body.sandboxId, b.body.sandboxId].sort());

    first.child.kill('SIGKILL');
    await exited(first.child);
    await reader.read().then(
      () => undefined,
      () => undefined,
    );

    const second = await serve();
    const call2 = api(second.url);
    const listed = await call2<{ sandboxes: { sandboxId: string; state: string; endReason?: string }[] }>('GET', '/v1/sandboxes?metadata=crash=a');
    const listedB = await call2<{ sandboxes: { sandboxId: string; state: string; endReason?: string }[] }>('GET', '/v1/sandboxes?metadata=crash=b');
    const records = [...listed.body.sandboxes, ...listedB.body.sandboxes];
    expect(records.map((r) => r.sandboxId).sort()).toEqual([a.body.sandboxId, b.body.sandboxId].sort());
    for (const record of records) {
      expect(['running', 'failed', 'expired'], JSON.stringify(record)).toContain(record.state);
      if (record.state !== 'running') expect(record.endReason, JSON.stringify(record)).toBeTruthy();
    }
    const recovered = new Set(records.filter((r) => r.state === 'running').map((r) => r.sandboxId));
    // Both were live with time left: the engine recovers them on their kept workspaces.
    expect(recovered.size, JSON.stringify(records)).toBe(2);

    // Nothing of a dead sandbox is left; a recovered one has its new cgroup and its kept files.
    const after = await hostState();
    expect(after.cgroups.sort()).toEqual([...recovered].sort());
    // Every process in a cgroup of this data dir belongs to a recovered sandbox: the old ones were
    // killed (allowing a moment for their zombies to be reaped). Sandbox uids are not checked: other
    // Capsule instances on this machine run sandboxes too.
    await waitFor(async () => ([...(await hostState()).processIds].every((id) => recovered.has(id)) ? true : undefined), {
      timeoutMs: 5000,
      what: 'no process of a dead sandbox',
    });
    expect(after.workspaces.sort()).toEqual([...recovered].sort());
    const kept = await fetch(`${second.url}/v1/sandboxes/${a.body.sandboxId}/files?path=kept.txt`, { headers: { authorization: `Bearer ${apiKey}` } });
    expect(await kept.text()).toBe('still here');
    // The recovered sandbox runs new processes; the old ones died with the old server.
    const ps = await call2<{ processes: unknown[] }>('GET', `/v1/sandboxes/${b.body.sandboxId}/processes`);
    expect(ps.body.processes).toEqual([]);

    // The exec the crash cut off: its outcome is reported as unknown, not left in progress.
    const op = await call2('GET', '/v1/operations/exec-at-crash');
    expect(op.body).toMatchObject({ status: 'completed', response: { status: 500, body: { code: 'INTERNAL' } } });

    // A graceful stop kills the recovered sandboxes and keeps every record.
    second.child.kill('SIGTERM');
    await exited(second.child);
    expect(second.child.exitCode, second.stderr()).toBe(0);
    const stopped = await hostState();
    expect(stopped.cgroups).toEqual([]);
    // Killed processes may be zombies for a moment until their new parent reaps them.
    await waitFor(async () => ((await hostState()).processIds.size === 0 ? true : undefined), {
      timeoutMs: 5000,
      what: 'no process of any sandbox left',
    });
    await waitFor(async () => ((await hostState()).workspaces.length === 0 ? true : undefined), { what: 'workspaces removed' });

    const verified = auditVerify();
    expect(verified.status).toBe(0);
    expect(verified.result.ok).toBe(true);
    expect(verified.result.records).toBeGreaterThan(4);

    const db = new Database(join(dataDir, 'capsule.db'));
    db.prepare("UPDATE audit SET outcome = 'forged' WHERE seq = 2").run();
    db.close();
    const tampered = auditVerify();
    expect(tampered.status).toBe(1);
    expect(tampered.result).toMatchObject({ ok: false, badSeq: 2 });
  });
});
