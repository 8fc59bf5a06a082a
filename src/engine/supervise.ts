import { isSandboxError, SandboxError } from '../errors/index.js';
import type { BackendSandbox, ExecRequest, SandboxCounters } from '../backends/backend.js';
import type { AgentProcess } from '../backends/agent/index.js';
import { classifyLimit, memoryWarningMessage } from './classify.js';
import { egressLimitHit } from './network-limit.js';
import { OutputBuffer, outputFields } from './output-buffer.js';
import { diagnose, TailBuffer } from './result.js';
import { type ExecResult, type Warning } from '../wire/index.js';

const MEMORY_POLL_MS = 50;

export interface SuperviseOptions {
  /** Wall-clock limit of this exec. @default spec.limits.wallClockMs */
  timeoutMs?: number;
  stdin?: string | Buffer;
  onStdout?: (chunk: Buffer) => void;
  onStderr?: (chunk: Buffer) => void;
  onWarning?: (warning: Warning) => void;
  /** Called once the process has started, with its pid inside the sandbox. */
  onStart?: (process: AgentProcess) => void;
  /**
   * Keep the output (up to the caps) for the result's stdout and stderr. A caller that keeps it
   * itself (the engine's process logs) passes false: the result's output fields are then empty
   * and only count bytes. @default true
   */
  keepOutput?: boolean;
  signal?: AbortSignal;
}

/**
 * Runs one process in a sandbox to completion under the sandbox's limits and returns a typed
 * result: output kept up to the caps (truncation flagged), usage, and the limit that ended it.
 */
export async function superviseExec(
  sandbox: BackendSandbox,
  request: ExecRequest,
  options: SuperviseOptions = {},
): Promise<ExecResult> {
  const limits = sandbox.spec.limits;
  const timeoutMs = options.timeoutMs ?? limits.wallClockMs;
  const keep = options.keepOutput ?? true;
  const stdout = new OutputBuffer(keep ? limits.stdoutBytes : 0);
  const stderr = new OutputBuffer(keep ? limits.stderrBytes : 0);
  const stderrTail = new TailBuffer();
  const warnings: Warning[] = [];
  options.signal?.throwIfAborted();

  const before = await sandbox.counters();
  const started = performance.now();
  let child: AgentProcess;
  try {
    child = await sandbox.exec({ ...request, stdin: request.stdin ?? options.stdin !== undefined });
  } catch (error) {
    if (isSandboxError(error, 'EXEC_FAILED')) {
      const failed = failedToStart(error, performance.now() - started, before);
      return { ...failed, diagnostic: diagnose(failed, request, []) };
    }
    throw error;
  }
  // Before the output listeners: the first listener is handed the output that came early, at
  // once, and a listener that aborts on what it reads must find the abort already watched.
  let timedOut = false;
  let aborted = false;
  const timer = setTimeout(() => {
    timedOut = true;
    child.signal('SIGKILL');
  }, timeoutMs);
  // Neither keeps the process alive: the agent's stream does while the exec matters, and a
  // server that stops and leaves its sandboxes running (the next one re-arms the wall clock from
  // the process's label) must not wait out a background process's wall clock.
  timer.unref();
  const onAbort = (): void => {
    aborted = true;
    child.signal('SIGKILL');
  };
  options.signal?.addEventListener('abort', onAbort, { once: true });
  // Aborted while the process was starting: the listener above will never hear it.
  if (options.signal?.aborted === true) onAbort();
  options.onStart?.(child);
  child.onStdout((chunk) => {
    stdout.push(chunk);
    options.onStdout?.(chunk);
  });
  child.onStderr((chunk) => {
    stderr.push(chunk);
    stderrTail.push(chunk);
    options.onStderr?.(chunk);
  });
  if (options.stdin !== undefined) {
    child.write(options.stdin);
    child.closeStdin();
  }

  const warnAt = limits.memoryBytes * limits.memoryWarnRatio;
  const poller = setInterval(() => {
    if (warnings.length > 0) return;
    sandbox.memoryUsageBytes().then(
      (used) => {
        if (used < warnAt || warnings.length > 0) return;
        const warning: Warning = {
          resource: 'memory',
          limit: limits.memoryBytes,
          used,
          message: memoryWarningMessage(limits.memoryBytes, used, limits.memoryWarnRatio),
        };
        warnings.push(warning);
        options.onWarning?.(warning);
      },
      () => undefined, // the cgroup is gone: the sandbox is being destroyed, the exit tells why
    );
  }, MEMORY_POLL_MS);
  poller.unref();

  const exit = await child.exited;
  clearTimeout(timer);
  clearInterval(poller);
  options.signal?.removeEventListener('abort', onAbort);
  const durationMs = Math.round(performance.now() - started);

  const after = await sandbox.counters().catch(() => before);
  // Disk usage only tells a failure apart (a full workspace); reading it costs a spawn the first
  // time per sandbox, so a clean exit skips it.
  const diskUsedBytes = exit.exitCode === 0 ? null : ((await sandbox.diskUsedBytes().catch(() => undefined)) ?? null);
  const usage = {
    memoryPeakBytes: after.memoryPeakBytes,
    cpuTimeMs: Math.round((after.cpuUsageUsec - before.cpuUsageUsec) / 1000),
    cpuThrottledMs: Math.round((after.cpuThrottledUsec - before.cpuThrottledUsec) / 1000),
    diskUsedBytes,
  };
  const base = {
    exitCode: exit.exitCode,
    signal: exit.signal,
    ...outputFields(stdout, stderr),
    durationMs,
    usage,
    warnings,
  };
  const limit =
    classifyLimit({ limits, timeoutMs, timedOut, durationMs, exitCode: exit.exitCode, signal: exit.signal, before, after, diskUsedBytes }) ??
    egressLimitHit(before, after, sandbox.spec.network, exit.exitCode !== 0);
  const done = (result: ExecResult): ExecResult => {
    const diagnostic = diagnose(result, request, stderrTail.lines());
    return diagnostic === undefined ? result : { ...result, diagnostic };
  };
  if (limit) return done({ ...base, outcome: 'limit_exceeded', limit });
  if (aborted) {
    return done({ ...base, outcome: 'error', error: { code: 'ABORTED', message: 'the caller aborted the process; it was killed' } });
  }
  if (exit.lost) {
    return done({
      ...base,
      outcome: 'error',
      error: { code: 'SANDBOX_CRASHED', message: `sandbox ${sandbox.id} stopped while the process ran` },
    });
  }
  return done({ ...base, outcome: exit.exitCode === 0 ? 'ok' : 'exit_nonzero' });
}

function failedToStart(error: SandboxError, durationMs: number, counters: SandboxCounters): ExecResult {
  return {
    outcome: 'error',
    exitCode: null,
    signal: null,
    stdout: '',
    stderr: '',
    stdoutTruncated: false,
    stderrTruncated: false,
    stdoutBytes: 0,
    stderrBytes: 0,
    durationMs: Math.round(durationMs),
    usage: { memoryPeakBytes: counters.memoryPeakBytes, cpuTimeMs: 0, cpuThrottledMs: 0, diskUsedBytes: null },
    warnings: [],
    error: { code: error.code, message: error.message },
  };
}
