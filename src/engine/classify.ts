import { constants } from 'node:os';
import type { Limits } from '../sandbox-spec/index.js';
import { formatBytes, formatDurationMs } from '../sandbox-spec/index.js';
import type { SandboxCounters } from '../backends/backend.js';
import type { LimitHit } from '../wire/index.js';

/** What the supervisor saw of one exec, enough to tell a limit from the program's own failure. */
export interface ExecObservation {
  limits: Limits;
  /** Effective wall-clock limit of this exec. */
  timeoutMs: number;
  timedOut: boolean;
  durationMs: number;
  exitCode: number | null;
  signal: string | null;
  before: SandboxCounters;
  after: SandboxCounters;
  diskUsedBytes: number | null;
}

const SIGXFSZ = constants.signals.SIGXFSZ;
/** btrfs refuses a write a few pages short of the quota; count that as reaching it. */
const DISK_SLACK_BYTES = 1024 * 1024;

/** The wall-clock limit `timeoutMs` ended a process that ran `durationMs`. */
export function wallClockLimit(timeoutMs: number, durationMs: number): LimitHit {
  return {
    resource: 'wall_clock',
    limit: timeoutMs,
    used: durationMs,
    unit: 'ms',
    message:
      `wall-clock limit ${formatDurationMs(timeoutMs)} exceeded (ran ${formatDurationMs(durationMs)}); ` +
      'the whole process tree was killed. Raise limits.wallClockMs (--timeout) or make the program finish sooner.',
  };
}

/** The limit that ended an exec, if any. Order matters: the kill we caused explains the rest. */
export function classifyLimit(o: ExecObservation): LimitHit | undefined {
  const failed = o.exitCode !== 0;
  if (o.timedOut) return wallClockLimit(o.timeoutMs, o.durationMs);
  if (o.after.oomKills > o.before.oomKills) {
    const peak = o.after.memoryPeakBytes;
    return {
      resource: 'memory',
      limit: o.limits.memoryBytes,
      used: peak,
      unit: 'bytes',
      message:
        `memory limit ${formatBytes(o.limits.memoryBytes)} exceeded (peak ${formatBytes(peak)}); ` +
        'the process was killed by the OOM killer. Raise limits.memoryBytes (--memory) or reduce the input.',
    };
  }
  if (o.signal === 'SIGXFSZ' || o.exitCode === 128 + SIGXFSZ) {
    return {
      resource: 'file_size',
      limit: o.limits.fileSizeBytes,
      used: null,
      unit: 'bytes',
      message:
        `file size limit ${formatBytes(o.limits.fileSizeBytes)} exceeded: a process tried to write a file past it and was stopped (SIGXFSZ). ` +
        'Raise limits.fileSizeBytes or write smaller files.',
    };
  }
  if (failed && o.diskUsedBytes !== null && o.diskUsedBytes >= o.limits.diskBytes - DISK_SLACK_BYTES) {
    return {
      resource: 'disk',
      limit: o.limits.diskBytes,
      used: o.diskUsedBytes,
      unit: 'bytes',
      message:
        `workspace disk limit ${formatBytes(o.limits.diskBytes)} reached (${formatBytes(o.diskUsedBytes)} used); ` +
        'writes failed with "Disk quota exceeded". Raise limits.diskBytes or delete files in /workspace.',
    };
  }
  // A fork that was refused is reported even when the program exited 0: a fork bomb's first
  // shell often does, while its children keep hitting the limit.
  if (o.after.pidsMaxEvents > o.before.pidsMaxEvents) {
    const refused = o.after.pidsMaxEvents - o.before.pidsMaxEvents;
    return {
      resource: 'pids',
      limit: o.limits.pids,
      used: o.limits.pids,
      unit: 'count',
      message:
        `process limit ${o.limits.pids} reached (${refused} fork${refused === 1 ? '' : 's'} refused); ` +
        'the program could not start more processes or threads. Raise limits.pids or start fewer.',
    };
  }
  return undefined;
}

/** A one-line warning text for memory pressure, emitted before any OOM kill. */
export function memoryWarningMessage(limit: number, used: number, ratio: number): string {
  return (
    `memory use ${formatBytes(used)} passed ${Math.round(ratio * 100)}% of the ${formatBytes(limit)} limit; ` +
    'the OOM killer ends the process at the limit. Raise limits.memoryBytes or free memory.'
  );
}
