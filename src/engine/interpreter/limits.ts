import { formatBytes, formatDurationMs } from '../../sandbox-spec/index.js';
import type { LimitHit } from '../../wire/index.js';
import type { InterpreterLanguage } from '../../wire/index.js';

/** The wall-clock limit of one runCode: the code was interrupted (or, if it would not stop, the context restarted). */
export function timeoutLimit(contextId: string, timeoutMs: number, durationMs: number, stateLost: boolean): LimitHit {
  const what = stateLost
    ? `the code did not stop when interrupted, so context ${contextId} was restarted and its state (variables, imports) is lost`
    : `the code was interrupted; context ${contextId} keeps the state it had before this call`;
  return {
    resource: 'wall_clock',
    limit: timeoutMs,
    used: durationMs,
    unit: 'ms',
    message:
      `wall-clock limit ${formatDurationMs(timeoutMs)} exceeded (ran ${formatDurationMs(durationMs)}); ${what}. ` +
      'Pass a larger timeoutMs (--timeout) or make the code finish sooner.',
  };
}

/** The sandbox's memory limit ended a context's interpreter (the OOM killer chose it). */
export function memoryLimit(contextId: string, language: InterpreterLanguage, memoryBytes: number, peakBytes: number): LimitHit {
  return {
    resource: 'memory',
    limit: memoryBytes,
    used: peakBytes,
    unit: 'bytes',
    message:
      `memory limit ${formatBytes(memoryBytes)} exceeded (peak ${formatBytes(peakBytes)}); the OOM killer ended the ${language} interpreter ` +
      `of context ${contextId} and its state is lost. Restart the context (restartContext("${contextId}")) to go on, ` +
      'and raise limits.memoryBytes (--memory) or use less memory.',
  };
}
