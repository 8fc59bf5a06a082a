import { wallClockLimit } from './classify.js';
import { SandboxError } from '../errors/index.js';
import type { AgentProcess } from '../backends/agent/index.js';
import type { BackendSandbox } from '../backends/backend.js';
import { baseEnv } from '../host/sandbox-layout.js';
import { userFor } from './templates.js';
import type { ExecResult, ProcessInfo, SandboxInfo } from '../wire/index.js';
import type { ObservedProcess, ProcessObserver } from './events.js';
import { ManagedProcess, type EndedProcessRecord } from './managed-process.js';
import type { ProcessLogs, LogOwner } from './process-logs.js';
import type { ProcessOutput } from './process-output.js';
import { superviseExec } from './supervise.js';
import type { ProcessHandle, StartProcessCommand } from './types.js';

/** Ended processes kept per sandbox for late reattach. */
const MAX_ENDED_PROCESSES = 100;

export interface ProcessTableOptions {
  observer: ProcessObserver;
  now: () => number;
  /** The operator's ceiling of one process's wall clock. */
  maxWallClockMs: number;
  /** Where each process's output is logged and replayed from, charged to the tenant's disk quota. */
  logs: ProcessLogs;
}

/**
 * The processes of one sandbox by pid: the running ones and the last ended ones, each with its
 * replayable event log, so a client that lost a stream reattaches by pid.
 */
export class ProcessTable {
  private readonly processes = new Map<number, ManagedProcess>();

  constructor(private readonly options: ProcessTableOptions) {}

  /** The processes of an ended sandbox from their records (`endedRecords`), their logs read back from disk. */
  static ofEnded(options: ProcessTableOptions, sandboxId: string, records: readonly EndedProcessRecord[]): ProcessTable {
    const table = new ProcessTable(options);
    for (const record of records) table.processes.set(record.info.pid, ManagedProcess.fromRecord(record, options.logs.pathOf(sandboxId, record.info.pid)));
    return table;
  }

  /**
   * Once every process ended and its log is closed: their records, to keep on disk instead of in
   * memory. Undefined when one of them did not end with a result (it stays in memory).
   */
  async endedRecords(): Promise<EndedProcessRecord[] | undefined> {
    const processes = [...this.processes.values()];
    await Promise.allSettled(processes.map((p) => p.ended));
    // Each log is closed once its process ended (start's `ended.finally`): wait for the writes.
    await this.options.logs.flushed();
    const records: EndedProcessRecord[] = [];
    for (const process of processes) {
      const record = process.record();
      if (!record) return undefined;
      records.push(record);
    }
    return records;
  }

  /**
   * Starts `command` under the sandbox's limits; resolves once it runs (EXEC_FAILED if it cannot,
   * QUOTA_EXCEEDED when the tenant's disk quota has no room for what its log may keep).
   */
  async start(info: SandboxInfo, sandbox: BackendSandbox, command: StartProcessCommand, quotaBytes?: number): Promise<ProcessHandle> {
    const { observer, now, maxWallClockMs, logs } = this.options;
    const spec = info.spec;
    if (command.timeoutMs !== undefined && (command.timeoutMs <= 0 || command.timeoutMs > maxWallClockMs)) {
      throw new SandboxError('INVALID_ARGUMENT', `timeoutMs must be between 1 and ${maxWallClockMs}`, {
        details: { field: 'timeoutMs', value: command.timeoutMs },
        hint: `Pass a wall clock of at most ${maxWallClockMs} ms, the operator's maximum.`,
      });
    }
    // Room in the tenant's disk budget for what the process's log keeps, before anything starts.
    const owner: LogOwner = { tenantId: info.tenantId, sandboxId: info.sandboxId, quotaBytes };
    const reserved = logs.reserve(owner, spec.limits);
    let log: ProcessOutput | undefined;
    let resolveStarted: (() => void) | undefined;
    const started = new Promise<void>((resolve) => (resolveStarted = resolve));
    let settle: ((result: Promise<ExecResult>) => void) | undefined;
    const settled = new Promise<ExecResult>((resolve) => (settle = (r) => resolve(r)));
    const meta = { argv: [...command.argv], cwd: command.cwd ?? spec.cwd, tag: command.tag, startedAt: new Date(now()).toISOString() };
    const managed = new ManagedProcess(meta, spec.limits, settled, command.pty !== undefined);
    const observed = (): ObservedProcess => ({ tenantId: info.tenantId, sandboxId: info.sandboxId, backend: info.backend, pid: managed.pid });
    const user = userFor(spec.template, command.user ?? spec.user);
    const result = superviseExec(
      sandbox,
      {
        argv: command.argv,
        env: { ...baseEnv(spec.template), ...spec.env, ...(command.env ?? {}) },
        cwd: command.cwd ?? spec.cwd,
        stdin: command.stdin ?? false,
        ...(command.pty ? { pty: command.pty } : {}),
        ...(user !== undefined ? { user } : {}),
        // Kept by the agent: a server that reattaches after a restart lists the process as it
        // was and holds it to the same wall clock.
        label: JSON.stringify({ ...meta, timeoutMs: command.timeoutMs ?? spec.limits.wallClockMs, ...(command.pty ? { pty: true } : {}) }),
      },
      {
        timeoutMs: command.timeoutMs ?? spec.limits.wallClockMs,
        keepOutput: false,
        onStart: (agent) => {
          log = logs.open({ ...owner, pid: agent.pid }, reserved, (high) => agent.throttle?.(high));
          managed.started(agent, log);
          this.processes.set(agent.pid, managed);
          this.trimEnded();
          observer.onProcessStart?.(observed());
          resolveStarted?.();
        },
        onStdout: (chunk) => managed.output('stdout', chunk),
        onStderr: (chunk) => managed.output('stderr', chunk),
        onWarning: (warning) => managed.warn(warning),
      },
    );
    settle?.(result);
    // The log is closed (its unused reservation given back) once the process ended.
    void managed.ended
      .finally(() => (log ? logs.closed({ ...owner, pid: managed.pid }, log) : logs.unreserve(owner, reserved)))
      .catch(() => undefined);
    // Observer hook: where a process's result settles (also for programs that never started).
    void result.then((r) => observer.onExecResult?.(observed(), r), () => undefined);
    const outcome = await Promise.race([started.then(() => undefined), result]);
    if (outcome !== undefined && outcome.error?.code === 'EXEC_FAILED') {
      throw new SandboxError('EXEC_FAILED', outcome.error.message, {
        details: { argv0: command.argv[0] },
        hint: 'Check that the program exists in the sandbox (PATH is /usr/local/bin:/usr/bin:/bin) and the cwd exists.',
      });
    }
    return managed;
  }

  /**
   * Takes over a process a previous Capsule process started (restored from a checkpoint): its
   * events from now on; output written while no host listened is gone.
   */
  adopt(info: SandboxInfo, agent: AgentProcess, quotaBytes?: number): void {
    if (this.processes.has(agent.pid)) return;
    const { now, logs } = this.options;
    const spec = info.spec;
    const owner = { tenantId: info.tenantId, sandboxId: info.sandboxId, quotaBytes, pid: agent.pid };
    // It runs already: its log takes room as it goes, without a reservation that could refuse it.
    const log = logs.open(owner, 0, (high) => agent.throttle?.(high));
    const adoptedAt = now();
    const labelledMeta = labelled(agent.label, { argv: ['(restored)'], cwd: spec.cwd, startedAt: new Date(adoptedAt).toISOString() });
    // The wall clock it was started with still runs from its start, across the restart, within
    // what a host could have given it: the label is the agent's, inside the sandbox.
    const { startedAt, timeoutMs } = adoptedWallClock(labelledMeta.startedAt, labelledTimeout(agent.label), {
      createdAtMs: Date.parse(info.createdAt),
      nowMs: adoptedAt,
      defaultTimeoutMs: spec.limits.wallClockMs,
      maxTimeoutMs: this.options.maxWallClockMs,
    });
    const meta = { ...labelledMeta, startedAt: new Date(startedAt).toISOString() };
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      agent.signal('SIGKILL');
    }, Math.max(0, startedAt + timeoutMs - adoptedAt));
    timer.unref();
    const result = agent.exited.then((exit): ExecResult => {
      clearTimeout(timer);
      const durationMs = now() - startedAt;
      const limit = timedOut ? wallClockLimit(timeoutMs, durationMs) : undefined;
      return {
        outcome: limit ? 'limit_exceeded' : exit.lost ? 'error' : exit.exitCode === 0 ? 'ok' : 'exit_nonzero',
        exitCode: exit.exitCode,
        signal: exit.signal,
        stdout: '',
        stderr: '',
        stdoutTruncated: false,
        stderrTruncated: false,
        stdoutBytes: 0,
        stderrBytes: 0,
        durationMs,
        usage: { memoryPeakBytes: 0, cpuTimeMs: 0, cpuThrottledMs: 0, diskUsedBytes: null },
        warnings: [],
        ...(limit ? { limit } : {}),
        ...(exit.lost && !limit ? { error: { code: 'SANDBOX_CRASHED', message: `sandbox ${info.sandboxId} stopped while the process ran` } } : {}),
      };
    });
    const managed = new ManagedProcess(meta, spec.limits, result, labelledPty(agent.label));
    managed.started(agent, log);
    agent.onStdout((chunk) => managed.output('stdout', chunk));
    agent.onStderr((chunk) => managed.output('stderr', chunk));
    void managed.ended.finally(() => logs.closed(owner, log)).catch(() => undefined);
    this.processes.set(agent.pid, managed);
  }

  get(sandboxId: string, pid: number): ProcessHandle {
    const process = this.processes.get(pid);
    if (!process) {
      throw new SandboxError('PROCESS_NOT_FOUND', `no process ${pid} in sandbox ${sandboxId}`, {
        details: { sandboxId, pid },
        hint: 'List processes to see the pids this sandbox knows.',
      });
    }
    return process;
  }

  list(): ProcessInfo[] {
    return [...this.processes.values()].map((p) => ({ ...p.info }));
  }

  private trimEnded(): void {
    if (this.processes.size <= MAX_ENDED_PROCESSES) return;
    for (const [pid, process] of this.processes) {
      if (this.processes.size <= MAX_ENDED_PROCESSES) break;
      if (!process.info.running) this.processes.delete(pid);
    }
  }
}

type ProcessMeta = Omit<ProcessInfo, 'pid' | 'running'>;

export interface WallClockBounds {
  /** When the sandbox was created: no process of it started before. */
  createdAtMs: number;
  nowMs: number;
  /** The wall clock of a process whose label names none (the spec's `limits.wallClockMs`). */
  defaultTimeoutMs: number;
  /** The most any process could be started with (the operator's maximum, as `start` checks). */
  maxTimeoutMs: number;
}

/**
 * The wall clock an adopted process is held to, from what its label says. The label is kept by
 * capsule-agent inside the sandbox, so sandbox code may have rewritten it: the start is clamped
 * to between the sandbox's creation and now (one that cannot be read is taken as the creation,
 * the earliest it can be), and the timeout to at most the operator's maximum, the largest a
 * server could have started it with.
 */
export function adoptedWallClock(startedAt: string, timeoutMs: number | undefined, bounds: WallClockBounds): { startedAt: number; timeoutMs: number } {
  const { nowMs } = bounds;
  const createdAtMs = Number.isFinite(bounds.createdAtMs) ? bounds.createdAtMs : nowMs;
  const labelledAt = Date.parse(startedAt);
  const start = Number.isFinite(labelledAt) ? Math.max(createdAtMs, labelledAt) : createdAtMs;
  return { startedAt: Math.min(start, nowMs), timeoutMs: Math.min(timeoutMs ?? bounds.defaultTimeoutMs, bounds.maxTimeoutMs) };
}

/** Whether a process was started with a pty, from its label (ProcessTable.start). */
function labelledPty(label: string | undefined): boolean {
  try {
    return (JSON.parse(label ?? '') as { pty?: unknown }).pty === true;
  } catch {
    return false;
  }
}

/** The wall clock a process was started with, from its label (ProcessTable.start). */
function labelledTimeout(label: string | undefined): number | undefined {
  try {
    const timeoutMs = (JSON.parse(label ?? '') as { timeoutMs?: unknown }).timeoutMs;
    return typeof timeoutMs === 'number' && timeoutMs > 0 ? timeoutMs : undefined;
  } catch {
    return undefined;
  }
}

/** What the label the process was started with says of it (ProcessTable.start), else `fallback`. */
function labelled(label: string | undefined, fallback: ProcessMeta): ProcessMeta {
  if (label === undefined || label === '') return fallback;
  try {
    const meta = JSON.parse(label) as Partial<ProcessMeta>;
    if (!Array.isArray(meta.argv) || typeof meta.cwd !== 'string' || typeof meta.startedAt !== 'string') return fallback;
    return { argv: meta.argv.map(String), cwd: meta.cwd, startedAt: meta.startedAt, ...(typeof meta.tag === 'string' ? { tag: meta.tag } : {}) };
  } catch {
    return fallback; // a label from another kind of host: the process is still taken over
  }
}
