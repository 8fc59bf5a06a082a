import { mkdtempSync, rmSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import type { SandboxInfo } from '../../src/wire/index.js';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { Sandbox } from '../../src/sdk/index.js';
import { LOCK_FILE } from '../../src/host/lock.host.js';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';
import { expectError, startTestServer, waitFor, type TestServer } from './server-helpers.js';
import { runCli, type CliRun } from '../helpers/cli.js';

/** Pause and resume over the HTTP API, the SDK and the CLI, on both backends, and across a server restart. */
afterEach(expectNoLeaks);

const host = new HostEnvironment({ dataDir: testDataDir() });
const COUNTER = 'i=0; while :; do i=$((i+1)); echo $i > /workspace/n.tmp; mv /workspace/n.tmp /workspace/n; sleep 0.02; done';

/** A variable only in memory; "show" on stdin prints it. */
const STATEFUL = [
  'import sys, secrets',
  'secret = secrets.token_hex(8)',
  'print("secret", secret, flush=True)',
  'for line in sys.stdin:',
  '    print("show", secret, flush=True)',
].join('\n');

/** The counter as the host sees it in the workspace (readable while the sandbox is paused). */
async function count(sandboxId: string): Promise<number> {
  return Number((await readFile(join(host.volume.path(sandboxId), 'n'), 'utf8').catch(() => '0')).trim() || 0);
}

async function countAbove(sandboxId: string, than: number): Promise<number> {
  return waitFor(async () => {
    const n = await count(sandboxId);
    return n > than ? n : undefined;
  }, { timeoutMs: 10_000, intervalMs: 20, what: `the counter of ${sandboxId} above ${than}` });
}

async function create(t: TestServer, spec: Record<string, unknown>): Promise<SandboxInfo> {
  const created = await t.json<SandboxInfo>('POST', '/v1/sandboxes', { body: { spec: { ttlMs: 120_000, ...spec } } });
  expect(created.status, JSON.stringify(created.body)).toBe(201);
  return created.body;
}

async function background(t: TestServer, sandboxId: string, argv: string[], stdin = false): Promise<number> {
  const started = await t.json<{ pid: number }>('POST', `/v1/sandboxes/${sandboxId}/processes`, { body: { argv, background: true, stdin } });
  expect(started.status, JSON.stringify(started.body)).toBe(201);
  return started.body.pid;
}

/** Reads a process's event stream until a stdout line starts with `prefix `; returns that line. */
async function stdoutLine(t: TestServer, sandboxId: string, pid: number, prefix: string): Promise<string> {
  const response = await t.call('GET', `/v1/sandboxes/${sandboxId}/processes/${pid}/events`);
  expect(response.status).toBe(200);
  const reader: ReadableStreamDefaultReader<Uint8Array> = response.body!.getReader();
  const decoder = new TextDecoder();
  let pending = '';
  let stdout = '';
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) throw new Error(`process ${pid} ended before printing "${prefix} ...": ${stdout}`);
      pending += decoder.decode(value, { stream: true });
      const lines = pending.split('\n');
      pending = lines.pop() ?? '';
      for (const line of lines.filter((l) => l !== '')) {
        const event = JSON.parse(line) as { type: string; data?: string };
        if (event.type === 'stdout' && event.data) stdout += Buffer.from(event.data, 'base64').toString();
      }
      const found = stdout.split('\n').slice(0, -1).find((l) => l.startsWith(`${prefix} `));
      if (found) return found;
    }
  } finally {
    await reader.cancel().catch(() => undefined);
  }
}

function cli(t: TestServer, ...argv: string[]): Promise<CliRun> {
  return runCli(argv, { CAPSULE_URL: t.url, CAPSULE_API_KEY: t.apiKey });
}

describe('pause and resume over the HTTP API', () => {
  it('namespace: a counter stops while paused (memory in RAM, not surviving a restart) and continues after resume', async () => {
    const t = await startTestServer();
    try {
      const { sandboxId } = await create(t, {});
      await background(t, sandboxId, ['sh', '-c', COUNTER]);
      await countAbove(sandboxId, 3);
      const paused = await t.json<SandboxInfo>('POST', `/v1/sandboxes/${sandboxId}/pause`, { body: {} });
      expect(paused.status, JSON.stringify(paused.body)).toBe(200);
      expect(paused.body.state).toBe('paused');
      expect(paused.body.pause).toMatchObject({ keepsMemory: true, survivesRestart: false });
      const atPause = await count(sandboxId);
      // While paused: no exec, a second pause is a conflict, and the counter does not move.
      const exec = await t.json('POST', `/v1/sandboxes/${sandboxId}/processes`, { body: { argv: ['true'] } });
      expect(exec.status).toBe(409);
      expectError(exec.body, 'SANDBOX_NOT_RUNNING');
      const again = await t.json('POST', `/v1/sandboxes/${sandboxId}/pause`);
      expect(again.status).toBe(409);
      expectError(again.body, 'CONFLICT');
      expect(await count(sandboxId)).toBe(atPause);
      expect((await t.json<SandboxInfo>('GET', `/v1/sandboxes/${sandboxId}`)).body.state).toBe('paused');

      const resumed = await t.json<SandboxInfo>('POST', `/v1/sandboxes/${sandboxId}/resume`);
      expect(resumed.status).toBe(200);
      expect(resumed.body.state).toBe('running');
      expect(resumed.body.pause).toBeUndefined();
      // It continues from its own value (memory kept), not from a restart at zero.
      expect(await count(sandboxId)).toBeGreaterThanOrEqual(atPause);
      await countAbove(sandboxId, atPause + 3);
      expect((await t.call('DELETE', `/v1/sandboxes/${sandboxId}`)).status).toBe(200);
    } finally {
      await t.server.close();
    }
  });

  it('SDK and CLI: pause({ keepMemory: false }) ends processes and keeps files; capsule sandbox pause/resume', async () => {
    const t = await startTestServer();
    try {
      const sandbox = await Sandbox.create({ ttlMs: 120_000 }, { url: t.url, apiKey: t.apiKey });
      await sandbox.files.write('kept.txt', 'still here');
      const paused = await sandbox.pause({ keepMemory: false });
      expect(paused.pause).toMatchObject({ keepsMemory: false });
      expect(sandbox.info.state).toBe('paused');
      expect((await sandbox.resume()).state).toBe('running');
      expect(await sandbox.files.read('kept.txt')).toBe('still here');

      const p = await cli(t, 'sandbox', 'pause', sandbox.sandboxId, '--no-memory', '--json');
      expect(p.code, p.stderr).toBe(0);
      expect(JSON.parse(p.stdout)).toMatchObject({ state: 'paused', pause: { keepsMemory: false } });
      const r = await cli(t, 'sandbox', 'resume', sandbox.sandboxId);
      expect(r.code, r.stderr).toBe(0);
      expect(r.stdout).toContain('state     running');
      const text = await cli(t, 'sandbox', 'pause', sandbox.sandboxId);
      expect(text.code, text.stderr).toBe(0);
      expect(text.stdout).toContain('paused    memory kept, lost if the server restarts');
      await sandbox.kill();
    } finally {
      await t.server.close();
    }
  });

  it('gVisor: paused with keepMemory, the server restarted (crash), resumed: the variable and the counter continue', async () => {
    const dbDir = mkdtempSync(join(testDataDir(), 'server-db-'));
    const first = await startTestServer({ databaseDir: dbDir });
    let second: TestServer | undefined;
    try {
      const { sandboxId } = await create(first, { backend: 'gvisor', limits: { wallClockMs: 120_000 } });
      const python = await background(first, sandboxId, ['python3', '-c', STATEFUL], true);
      const secret = (await stdoutLine(first, sandboxId, python, 'secret')).split(' ')[1];
      await background(first, sandboxId, ['sh', '-c', COUNTER]);
      await countAbove(sandboxId, 3);
      const paused = await first.json<SandboxInfo>('POST', `/v1/sandboxes/${sandboxId}/pause`, { body: { keepMemory: true } });
      expect(paused.status, JSON.stringify(paused.body)).toBe(200);
      expect(paused.body.pause).toMatchObject({ keepsMemory: true, survivesRestart: true });
      const atPause = await count(sandboxId);

      // The first server dies without its graceful close (which would kill every sandbox): its
      // listener and database go, its lock is left as a crash leaves it; its engine is dropped.
      await first.server.app.app.close();
      first.server.db.close();
      rmSync(join(testDataDir(), LOCK_FILE), { force: true });

      // The same operator key: the sandbox belongs to its tenant.
      const restarted = await startTestServer({ databaseDir: dbDir, env: { CAPSULE_API_KEY: first.apiKey } });
      second = restarted;
      const t: TestServer = { ...restarted, apiKey: first.apiKey, call: (m, p, o = {}) => restarted.call(m, p, { ...o, key: first.apiKey }) };
      const record = await t.json<SandboxInfo>('GET', `/v1/sandboxes/${sandboxId}`, { key: first.apiKey });
      expect(record.body.state).toBe('paused');
      expect(await count(sandboxId)).toBe(atPause);
      const resumed = await t.json<SandboxInfo>('POST', `/v1/sandboxes/${sandboxId}/resume`, { key: first.apiKey });
      expect(resumed.body.state, JSON.stringify(resumed.body)).toBe('running');
      await countAbove(sandboxId, atPause + 3);
      // The restored Python process still holds its variable.
      const shown = stdoutLine(t, sandboxId, python, 'show');
      expect((await t.call('POST', `/v1/sandboxes/${sandboxId}/processes/${python}/stdin`, { raw: 'show\n', headers: { 'content-type': 'application/octet-stream' } })).status).toBe(204);
      expect((await shown).split(' ')[1]).toBe(secret);
      expect((await t.call('DELETE', `/v1/sandboxes/${sandboxId}`)).status).toBe(200);
    } finally {
      await second?.server.close();
      if (!second) await first.server.close().catch(() => undefined);
    }
  });
});
