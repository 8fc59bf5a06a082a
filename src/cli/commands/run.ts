import { constants } from 'node:os';
import { resolve } from 'node:path';
import { Command } from 'commander';
import { formatBytes } from '../../sandbox-spec/units.js';
// Static: this module is loaded only for `capsule run` (command-table.ts), which needs the engine.
import { Runner, type RunResult } from '../../engine/runner.js';
import { collect, durationOption } from '../options.js';
import { specFromFlags, withSpecOptions, type SpecFlags } from '../spec-flags.js';
import { EXIT_COMMAND_NOT_FOUND, EXIT_INTERNAL, LIMIT_EXIT_CODES } from '../exit-codes.js';
import type { CliContext } from '../context.js';

interface RunFlags extends SpecFlags {
  timeout?: number;
  input?: string;
  output?: string;
  cwd?: string;
  json?: boolean;
  dataDir?: string;
}

export function runCommand(context: CliContext): Command {
  return withSpecOptions(
    new Command('run')
      .description('Run one command in a fresh sandbox and destroy it afterwards')
      .option('--timeout <duration>', 'wall-clock limit, e.g. 10s (default 30s)', durationOption('--timeout')),
  )
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
Any other spec field (limits.tmpBytes, mounts, ...) goes in --spec FILE.json; the flags override it.

Exit status: the command's own (128+N when signal N ended it), or
  ${LIMIT_EXIT_CODES.wall_clock} wall clock, ${LIMIT_EXIT_CODES.memory} memory, ${LIMIT_EXIT_CODES.pids} pids, ${LIMIT_EXIT_CODES.disk} disk, ${LIMIT_EXIT_CODES.file_size} file size (limit exceeded);
  127 command not found in the sandbox, 2 bad flags or spec, 69 host not ready, 70 internal error.`,
    )
    .action(async (command: string[], flags: RunFlags) => {
      const spec = specFromFlags(flags, { limits: { wallClockMs: flags.timeout } });
      // The host stays prepared after the run (the workspace volume mounted), so the next
      // `capsule run` does not mount it again; the run's own sandbox is gone either way.
      const runner = new Runner({ dataDir: flags.dataDir, keepVolumeMounted: true });
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
