import { spawn } from 'node:child_process';
import { SandboxError } from '../errors/index.js';

export interface CommandResult {
  exitCode: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

export interface RunCommandOptions {
  /** Fail with HOST_NOT_READY unless the command exits 0. @default true */
  check?: boolean;
  timeoutMs?: number;
  input?: string;
}

/** Runs a host tool (btrfs, ip, nft) by argv and collects its output. Never a shell string. */
export async function runCommand(argv: readonly string[], options: RunCommandOptions = {}): Promise<CommandResult> {
  const [file, ...args] = argv;
  if (file === undefined) throw new SandboxError('INTERNAL', 'runCommand needs a program');
  const { check = true, timeoutMs = 30_000 } = options;
  const child = spawn(file, args, {
    stdio: [options.input === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'],
    timeout: timeoutMs,
    killSignal: 'SIGKILL',
  });
  if (options.input !== undefined) child.stdin?.end(options.input);
  const stdout: Buffer[] = [];
  const stderr: Buffer[] = [];
  child.stdout?.on('data', (chunk: Buffer) => stdout.push(chunk));
  child.stderr?.on('data', (chunk: Buffer) => stderr.push(chunk));
  const result = await new Promise<CommandResult>((resolve, reject) => {
    child.once('error', (error) =>
      reject(
        new SandboxError('HOST_NOT_READY', `cannot run ${file}: ${error.message}`, {
          cause: error,
          hint: 'Run scripts/setup.sh to install the host tools Capsule needs.',
        }),
      ),
    );
    child.once('close', (exitCode, signal) =>
      resolve({
        exitCode,
        signal,
        stdout: Buffer.concat(stdout).toString('utf8'),
        stderr: Buffer.concat(stderr).toString('utf8'),
      }),
    );
  });
  if (check && result.exitCode !== 0) {
    const why = result.stderr.trim() || `exit ${result.exitCode ?? result.signal}`;
    throw new SandboxError('HOST_NOT_READY', `${argv.slice(0, 3).join(' ')} failed: ${why}`, {
      details: { argv: argv.slice(0, 6), exitCode: result.exitCode },
    });
  }
  return result;
}
