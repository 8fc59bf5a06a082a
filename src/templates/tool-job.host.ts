import { spawn } from 'node:child_process';
import { availableParallelism } from 'node:os';
import { SandboxError } from '../errors/index.js';
import { SandboxCgroup, type CgroupLimits } from '../host/cgroups.host.js';
import { ownedName } from './owner.js';

/** Build jobs' cgroups are `<instance prefix>build-<owner>`: reconcile removes those of dead owners. */
export const BUILD_CGROUP = 'build-';

const GiB = 1024 ** 3;
const STDOUT_CAP = 8 * 1024 * 1024;
const TAIL_LINES = 40;
const LINE_CAP = 4096;

export interface ToolJobOptions {
  /** The host tool and its arguments; argv[0] is an absolute path (capsule-launch execs it as is). */
  argv: string[];
  /** capsule-launch (HostPaths.launcher): it forks the tool straight into the job's cgroup. */
  launcher: string;
  /** The Capsule instance's cgroup prefix; the job's group is `<prefix>build-<owner>`. */
  cgroupPrefix: string;
  /** The tool's whole environment; nothing of Capsule's own is passed on. */
  env: Record<string, string>;
  /** Each line the tool writes, as it comes. */
  onLine?: (line: string, stream: 'stdout' | 'stderr') => void;
  signal?: AbortSignal;
  /** @default 30 minutes */
  timeoutMs?: number;
  /** @default 4 GiB memory, 4096 pids, every core */
  limits?: CgroupLimits;
}

export interface ToolJobResult {
  exitCode: number | null;
  /** Standard output (up to 8 MiB), for tools whose answer is their output. */
  stdout: string;
  /** The last lines of standard error, for error messages. */
  stderrTail: string[];
}

/**
 * Runs a host tool (mmdebstrap, skopeo, umoci) as a job of its own: in a cgroup made for it, so
 * that a cancel or a timeout ends it and everything it forked at once (`cgroup.kill`) and waits
 * until nothing of it runs, before the caller deletes what it was writing. mmdebstrap's perl
 * workers and dpkg outlive a kill of the top process otherwise (R1 §3).
 */
export async function runToolJob(options: ToolJobOptions): Promise<ToolJobResult> {
  options.signal?.throwIfAborted();
  const limits = options.limits ?? { memoryBytes: 4 * GiB, pids: 4096, cpus: availableParallelism() };
  const cgroup = await SandboxCgroup.create(options.cgroupPrefix, `${BUILD_CGROUP}${ownedName()}`, limits);
  try {
    return await run(options, cgroup);
  } finally {
    await cgroup.remove();
  }
}

async function run(options: ToolJobOptions, cgroup: SandboxCgroup): Promise<ToolJobResult> {
  const child = spawn(options.launcher, [...cgroup.launchArgs(), '--', ...options.argv], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: options.env,
  });
  const stdout: Buffer[] = [];
  let stdoutBytes = 0;
  const tail: string[] = [];
  const lines = (stream: 'stdout' | 'stderr') => {
    let rest = '';
    return (chunk: Buffer) => {
      const text = rest + chunk.toString('utf8');
      const parts = text.split(/\r?\n|\r/);
      rest = parts.pop() ?? '';
      if (rest.length > LINE_CAP) {
        parts.push(rest.slice(0, LINE_CAP));
        rest = '';
      }
      for (const line of parts) emit(line.slice(0, LINE_CAP), stream);
    };
  };
  const emit = (line: string, stream: 'stdout' | 'stderr') => {
    if (line === '') return;
    if (stream === 'stderr') {
      tail.push(line);
      if (tail.length > TAIL_LINES) tail.shift();
    }
    options.onLine?.(line, stream);
  };
  const onStdoutLine = lines('stdout');
  child.stdout.on('data', (chunk: Buffer) => {
    if (stdoutBytes < STDOUT_CAP) stdout.push(chunk);
    stdoutBytes += chunk.length;
    if (options.onLine) onStdoutLine(chunk);
  });
  child.stderr.on('data', lines('stderr'));

  let stopped: SandboxError | undefined;
  const stop = (error: SandboxError) => {
    stopped ??= error;
    void cgroup.kill().catch(() => undefined);
  };
  const onAbort = () => stop(new SandboxError('ABORTED', `${basename(options.argv[0])} was cancelled`));
  options.signal?.addEventListener('abort', onAbort, { once: true });
  const timeoutMs = options.timeoutMs ?? 30 * 60_000;
  const timer = setTimeout(
    () => stop(new SandboxError('TIMEOUT', `${basename(options.argv[0])} ran past ${Math.round(timeoutMs / 1000)} s and was stopped`)),
    timeoutMs,
  );
  try {
    const exitCode = await new Promise<number | null>((resolve, reject) => {
      child.once('error', (error) =>
        reject(new SandboxError('HOST_NOT_READY', `cannot run ${options.launcher}: ${error.message}`, { cause: error, hint: 'Run npm run build (capsule-launch) and scripts/setup.sh.' })),
      );
      child.once('close', (code) => resolve(code));
    });
    if (stopped) throw stopped;
    if (exitCode === 125 && tail.some((line) => line.startsWith('capsule-launch:'))) {
      throw new SandboxError('HOST_NOT_READY', `cannot start ${basename(options.argv[0])}: ${tail.join(' ')}`, { hint: 'Run scripts/setup.sh to install the template tools.' });
    }
    return { exitCode, stdout: Buffer.concat(stdout).toString('utf8'), stderrTail: tail };
  } finally {
    clearTimeout(timer);
    options.signal?.removeEventListener('abort', onAbort);
  }
}

function basename(path: string | undefined): string {
  return (path ?? '').split('/').pop() ?? '';
}
