import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import type { AgentExit, AgentProcess } from '../../src/backends/agent/index.js';
import { ProcessLogs } from '../../src/engine/process-logs.js';
import { adoptedWallClock, ProcessTable } from '../../src/engine/process-table.js';
import { parseSpec } from '../../src/sandbox-spec/index.js';
import type { SandboxInfo } from '../../src/wire/index.js';

/*
 * A reattached process's wall clock comes from its START label, which capsule-agent keeps inside
 * the sandbox: sandbox code may have rewritten it. The engine holds the process to a clock
 * between the sandbox's creation and now, and to no more than the operator's maximum.
 */
const CREATED = Date.parse('2026-12-01T10:00:00.000Z');
const NOW = CREATED + 60 * 60_000; // an hour later, at the reattach
const bounds = { createdAtMs: CREATED, nowMs: NOW, defaultTimeoutMs: 30_000, maxTimeoutMs: 3_600_000 };
const iso = (ms: number): string => new Date(ms).toISOString();

describe('adoptedWallClock', () => {
  it('keeps an honest label as it is', () => {
    expect(adoptedWallClock(iso(NOW - 5_000), 600_000, bounds)).toEqual({ startedAt: NOW - 5_000, timeoutMs: 600_000 });
    // A process started with no timeout of its own has the spec's.
    expect(adoptedWallClock(iso(NOW - 5_000), undefined, bounds)).toEqual({ startedAt: NOW - 5_000, timeoutMs: 30_000 });
  });

  it('never starts the clock after now: a start moved into the future buys no time', () => {
    expect(adoptedWallClock(iso(NOW + 24 * 3_600_000), 600_000, bounds).startedAt).toBe(NOW);
  });

  it('never starts the clock before the sandbox existed', () => {
    expect(adoptedWallClock(iso(CREATED - 3_600_000), 600_000, bounds).startedAt).toBe(CREATED);
  });

  it('takes a start it cannot read as the sandbox\'s creation, the earliest it can be', () => {
    expect(adoptedWallClock('not a date', 600_000, bounds).startedAt).toBe(CREATED);
  });

  it('holds the timeout to the operator maximum, the most a server could have started it with', () => {
    expect(adoptedWallClock(iso(NOW), 1e15, bounds).timeoutMs).toBe(3_600_000);
  });
});

describe('ProcessTable.adopt', () => {
  // Made in a hook: collecting the tests (`vitest list`) runs none, and would leave the directory.
  let dir: string;
  let logs: ProcessLogs;
  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), 'capsule-process-clock-'));
    logs = new ProcessLogs({ dataDir: dir });
  });
  // The ended process's log is written and closed in the background: removed before that, the
  // directory came back with it.
  afterAll(async () => {
    await logs.flushed();
    rmSync(dir, { recursive: true, force: true });
  });
  afterEach(() => vi.useRealTimers());

  /** An agent process that records the signals it gets and exits on SIGKILL. */
  function fakeAgent(label: string): AgentProcess & { signals: (NodeJS.Signals | number)[] } {
    let exit: (value: AgentExit) => void = () => undefined;
    const exited = new Promise<AgentExit>((resolve) => (exit = resolve));
    const signals: (NodeJS.Signals | number)[] = [];
    return {
      id: 1, pid: 7, label, exited, signals,
      onStdout: () => undefined, onStderr: () => undefined, write: () => undefined, closeStdin: () => undefined, resize: () => undefined,
      signal: (signal) => {
        signals.push(signal);
        if (signal === 'SIGKILL') exit({ exitCode: null, signal: 'SIGKILL', lost: false });
      },
    };
  }

  it('kills a process whose label claims a later start and a longer clock at the clamped deadline, as the wall-clock limit', async () => {
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout'] });
    let now = NOW;
    const table = new ProcessTable({ observer: {}, now: () => now, maxWallClockMs: 3_600_000, logs });
    const info = {
      sandboxId: 'sbx_clock', tenantId: 't', state: 'running', backend: 'namespace', spec: parseSpec({}), metadata: {},
      createdAt: iso(CREATED), expiresAt: iso(CREATED + 24 * 3_600_000),
    } as SandboxInfo;
    // Rewritten inside the sandbox: started a day from now, with a clock of ~30 years.
    const agent = fakeAgent(JSON.stringify({ argv: ['sleep', 'inf'], cwd: '/workspace', startedAt: iso(NOW + 24 * 3_600_000), timeoutMs: 1e12 }));
    table.adopt(info, agent);
    const [listed] = table.list();
    expect(listed).toMatchObject({ pid: 7, argv: ['sleep', 'inf'], startedAt: iso(NOW), running: true });
    now = NOW + 3_600_000 - 1;
    vi.advanceTimersByTime(3_600_000 - 1);
    expect(agent.signals).toEqual([]);
    now = NOW + 3_600_000;
    vi.advanceTimersByTime(1);
    expect(agent.signals).toEqual(['SIGKILL']);
    const result = await table.get('sbx_clock', 7).result;
    expect(result).toMatchObject({ outcome: 'limit_exceeded', limit: { resource: 'wall_clock', limit: 3_600_000 } });
  });
});
