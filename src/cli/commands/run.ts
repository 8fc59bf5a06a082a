import { constants } from 'node:os';
import { resolve } from 'node:path';
import { Command, Option } from 'commander';
import { formatBytes } from '../../spec/index.js';
import type { RunResult } from '../../engine/runner.js';
import type { SandboxSpecInput } from '../../spec/index.js';
import { bytesOption, collect, durationOption, numberOption, parseEnvPairs } from '../options.js';
import { EXIT_COMMAND_NOT_FOUND, EXIT_INTERNAL, LIMIT_EXIT_CODES } from '../exit-codes.js';
import type { CliContext } from '../context.js';

interface RunFlags {
  network: 'none' | 'allowlist' | 'internet';
  allow?: string[];
  handle?: string[];
  memory?: number;
  timeout?: number;
  cpus?: number;
  pids?: number;
  disk?: number;
  fileSize?: number;
  env?: string[];
  input?: string;
  output?: string;
  cwd?: string;
  json?: boolean;
  dataDir?: string;
}

export function runCommand(context: CliContext): Command {
  return new Command('run')
    .description('Run one command in a fresh sandbox and destroy it afterwards')
    .addOption(new Option('--network <mode>', 'network access').choices(['none', 'allowlist', 'internet']).default('none'))
    .option('--allow <domain-or-cidr>', 'allowed destination (repeatable, with --network allowlist)', collect)
    .option('--handle <name>', 'credential-broker handle the sandbox may use (repeatable)', collect)
    .option('--memory <size>', 'memory limit, e.g. 256MiB (default 512MiB)', bytesOption('--memory'))
    .option('--timeout <duration>', 'wall-clock limit, e.g. 10s (default 30s)', durationOption('--timeout'))
    .option('--cpus <n>', 'CPU cores (default 1)', numberOption('--cpus'))
    .option('--pids <n>', 'process limit (default 128)', numberOption('--pids'))
    .option('--disk <size>', 'workspace disk limit (default 512MiB)', bytesOption('--disk'))
    .option('--file-size <size>', 'largest file a process may write (default 64MiB)', bytesOption('--file-size'))
    .option('--env <KEY=VALUE>', 'environment variable (repeatable); nothing else is inherited', collect)
    .option('--input <dir>', 'host directory shown read-only at /input')
    .option('--output <dir>', 'host directory that receives /workspace/output after the run')
    .option('--cwd <dir>', 'working directory inside the sandbox (default /workspace)')
    .option('--data-dir <dir>', 'Capsule data directory (default /var/lib/capsule)')
    .option('--json', 'print the result as one JSON object on stdout')
    .argument('<command...>', 'the command and its arguments (put -- before them)')
    .addHelpText(
      'after',
      `
Exit status: the command's own (128+N when signal N ended it), or
  ${LIMIT_EXIT_CODES.wall_clock} wall clock, ${LIMIT_EXIT_CODES.memory} memory, ${LIMIT_EXIT_CODES.pids} pids, ${LIMIT_EXIT_CODES.disk} disk, ${LIMIT_EXIT_CODES.file_size} file size (limit exceeded);
  127 command not found in the sandbox, 2 bad flags or spec, 69 host not ready, 70 internal error.`,
    )
    .action(async (command: string[], flags: RunFlags) => {
      const spec: SandboxSpecInput = {
        limits: {
          ...(flags.memory !== undefined && { memoryBytes: flags.memory }),
          ...(flags.timeout !== undefined && { wallClockMs: flags.timeout }),
          ...(flags.cpus !== undefined && { cpus: flags.cpus }),
          ...(flags.pids !== undefined && { pids: flags.pids }),
          ...(flags.disk !== undefined && { diskBytes: flags.disk }),
          ...(flags.fileSize !== undefined && { fileSizeBytes: flags.fileSize }),
        },
        network: { mode: flags.network, allow: flags.allow ?? [], handles: flags.handle ?? [] },
        env: parseEnvPairs(flags.env ?? []),
      };
      // Loaded here, not at start-up: other commands need none of the engine.
      const { Runner } = await import('../../engine/runner.js');
      const runner = new Runner({ dataDir: flags.dataDir });
      const json = flags.json === true;
      const result = await runner.run(command, {
        spec,
        inputDir: flags.input === undefined ? undefined : resolve(flags.input),
        outputDir: flags.output === undefined ? undefined : resolve(flags.output),
        cwd: flags.cwd,
        onStdout: json ? undefined : (chunk) => context.stdout.write(chunk),
        onStderr: json ? undefined : (chunk) => context.stderr.write(chunk),
        onWarning: json ? undefined : (warning) => context.stderr.write(`capsule: warning: ${warning.message}\n`),
      }).finally(() => runner.close());
      if (json) context.stdout.write(`${JSON.stringify(result)}\n`);
      else context.stderr.write(`${summarize(result)}\n`);
      context.exitCode = exitCodeOf(result);
    });
}

function exitCodeOf(result: RunResult): number {
  if (result.outcome === 'limit_exceeded' && result.limit) return LIMIT_EXIT_CODES[result.limit.resource];
  if (result.outcome === 'error') return result.error?.code === 'EXEC_FAILED' ? EXIT_COMMAND_NOT_FOUND : EXIT_INTERNAL;
  if (result.exitCode !== null) return result.exitCode;
  return 128 + (result.signal ? signalNumber(result.signal) : 0);
}

function signalNumber(name: string): number {
  return (constants.signals as Record<string, number>)[name] ?? 0;
}

/** One line for people: how it ended, how long, and the truncation flags. */
function summarize(result: RunResult): string {
  const time = `${result.durationMs} ms`;
  const peak = `peak memory ${formatBytes(result.usage.memoryPeakBytes)}`;
  const flags = [
    result.stdoutTruncated ? `stdout truncated (${formatBytes(result.stdoutBytes)} written)` : '',
    result.stderrTruncated ? `stderr truncated (${formatBytes(result.stderrBytes)} written)` : '',
  ].filter(Boolean);
  const extra = flags.length > 0 ? `; ${flags.join('; ')}` : '';
  switch (result.outcome) {
    case 'ok':
      return `capsule: ok, exit 0 in ${time}, ${peak}${extra}`;
    case 'exit_nonzero':
      return `capsule: exit ${result.exitCode ?? result.signal} in ${time}, ${peak}${extra}`;
    case 'limit_exceeded':
      return `capsule: limit exceeded (${result.limit?.resource}): ${result.limit?.message}${extra}`;
    case 'error':
      return `capsule: error ${result.error?.code}: ${result.error?.message}`;
  }
}
