import { describe, expect, it } from 'vitest';
import { superviseExec } from '../../src/engine/supervise.js';
import type { BackendSandbox } from '../../src/backends/backend.js';
import type { AgentExit, AgentProcess } from '../../src/backends/agent/index.js';
import { parseSpec } from '../../src/sandbox-spec/index.js';

const COUNTERS = { oomKills: 0, pidsMaxEvents: 0, memoryPeakBytes: 0, memoryUsageBytes: 0, cpuUsageUsec: 0, cpuThrottledUsec: 0 };

/**
 * A process whose first output came before anyone listened: like the agent client's, the first
 * listener is handed it at once. It exits only when signalled.
 */
function earlyTalker(early: string): { process: AgentProcess; signals: (NodeJS.Signals | number)[] } {
  const signals: (NodeJS.Signals | number)[] = [];
  let settle!: (exit: AgentExit) => void;
  const exited = new Promise<AgentExit>((resolve) => (settle = resolve));
  const process: AgentProcess = {
    id: 1,
    pid: 2,
    exited,
    onStdout: (listener) => listener(Buffer.from(early)),
    onStderr: () => undefined,
    write: () => undefined,
    closeStdin: () => undefined,
    signal: (signal) => {
      signals.push(signal);
      settle({ exitCode: null, signal: 'SIGKILL', lost: false });
    },
    resize: () => undefined,
  };
  return { process, signals };
}

/** Only what superviseExec reads of a sandbox; the process is the one under test. */
function sandboxRunning(process: AgentProcess): BackendSandbox {
  const sandbox: Partial<BackendSandbox> = {
    id: 'sb-test',
    spec: parseSpec({}),
    lost: new Promise<void>(() => undefined),
    exec: () => Promise.resolve(process),
    counters: () => Promise.resolve({ ...COUNTERS }),
    memoryUsageBytes: () => Promise.resolve(0),
    diskUsedBytes: () => Promise.resolve(undefined),
  };
  return sandbox as BackendSandbox;
}

describe('superviseExec and its abort signal', () => {
  it('kills the process when a listener aborts on output that came before it listened', async () => {
    const { process, signals } = earlyTalker('started\n');
    const controller = new AbortController();
    const result = superviseExec(sandboxRunning(process), { argv: ['sh'], env: {}, cwd: '/workspace' }, {
      timeoutMs: 10 * 60_000,
      signal: controller.signal,
      onStdout: (chunk) => chunk.toString().includes('started') && controller.abort(),
    });
    // Everything above runs in the turns that follow: a missed abort leaves the process running
    // (no signal), and only the 10-minute wall clock would end it.
    await new Promise((resolve) => setImmediate(resolve));
    expect(signals).toEqual(['SIGKILL']);
    expect((await result).error?.code).toBe('ABORTED');
  });

  it('kills the process when the signal was aborted while it started', async () => {
    const { process, signals } = earlyTalker('');
    const controller = new AbortController();
    const sandbox = sandboxRunning(process);
    const exec = sandbox.exec.bind(sandbox);
    sandbox.exec = (request) => exec(request).finally(() => controller.abort());
    const result = superviseExec(sandbox, { argv: ['sh'], env: {}, cwd: '/workspace' }, { timeoutMs: 10 * 60_000, signal: controller.signal });
    await new Promise((resolve) => setImmediate(resolve));
    expect(signals).toEqual(['SIGKILL']);
    expect((await result).error?.code).toBe('ABORTED');
  });
});
