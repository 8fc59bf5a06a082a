import { Command, Option } from 'commander';
import { SandboxError } from '../../errors/index.js';
import type { RunCodeOnceResult } from '../../engine/interpreter/run-once.js';
import { INTERPRETER_LANGUAGES } from '../../wire/constants.js';
import type { CodeResult, Execution, ExecutionError, InterpreterLanguage } from '../../wire/index.js';
import { Sandbox } from '../../sdk/index.js';
import { bytesOption, durationOption } from '../options.js';
import { LIMIT_EXIT_CODES } from '../exit-codes.js';
import type { CliContext } from '../context.js';
import { connection } from './sandbox.js';

interface RunCodeFlags {
  language?: InterpreterLanguage;
  json?: boolean;
  timeout?: number;
  memory?: number;
  dataDir?: string;
  sandbox?: string;
  context?: string;
  url?: string;
  apiKey?: string;
}

/** Exit status when the code raised an exception. */
const EXIT_CODE_ERROR = 1;

/**
 * `capsule run-code`: code in an interpreter context. Without `--sandbox`, one-shot in a fresh
 * sandbox on this host; with `--sandbox ID [--context ID]`, in a live sandbox's context on a
 * Capsule server through the SDK, so its variables are there for the next call.
 */
export function runCodeCommand(context: CliContext): Command {
  return new Command('run-code')
    .description('Run code in a sandbox interpreter (Python by default) and print its output and results')
    .addOption(new Option('--language <language>', 'interpreter (default python)').choices([...INTERPRETER_LANGUAGES]))
    .option('--sandbox <id>', "run in this live sandbox's context on the server (CAPSULE_URL, CAPSULE_API_KEY)")
    .option('--context <id>', 'with --sandbox: the context to run in (default: the language\'s default context)')
    .option('--url <url>', 'with --sandbox: Capsule server (default $CAPSULE_URL or http://127.0.0.1:7070)')
    .option('--api-key <key>', 'with --sandbox: API key (default $CAPSULE_API_KEY)')
    .option('--timeout <duration>', 'wall-clock limit of the code, e.g. 10s (default 30s)', durationOption('--timeout'))
    .option('--memory <size>', 'one-shot: sandbox memory limit, e.g. 1GiB (default 512MiB)', bytesOption('--memory'))
    .option('--data-dir <dir>', 'one-shot: Capsule data directory (default /var/lib/capsule)')
    .option('--json', 'print NDJSON events (stdout, stderr, result, error) and a final end event')
    .argument('<code>', 'the code to run; "-" reads it from stdin')
    .addHelpText(
      'after',
      `
Exit status: 0, or 1 when the code raised an exception, or
  ${LIMIT_EXIT_CODES.wall_clock} wall clock, ${LIMIT_EXIT_CODES.memory} memory (limit exceeded); 2 bad flags, 69 host not ready, 70 internal error.`,
    )
    .action(async (code: string, flags: RunCodeFlags) => {
      const source = code === '-' ? await readStdin() : code;
      const json = flags.json === true;
      const event = (value: object): void => void context.stdout.write(`${JSON.stringify(value)}\n`);
      const output = {
        onStdout: (text: string) => (json ? event({ type: 'stdout', text }) : context.stdout.write(text)),
        onStderr: (text: string) => (json ? event({ type: 'stderr', text }) : context.stderr.write(text)),
        onResult: (r: CodeResult) => (json ? event({ type: 'result', ...r }) : context.stdout.write(describeResult(r))),
        onError: (e: ExecutionError) => (json ? event({ type: 'error', ...e }) : context.stderr.write(`${e.traceback || `${e.name}: ${e.value}`}\n`)),
      };
      let result: Execution;
      if (flags.sandbox !== undefined) {
        for (const [flag, value] of [['--memory', flags.memory], ['--data-dir', flags.dataDir]] as const) {
          if (value !== undefined) throw new SandboxError('INVALID_ARGUMENT', `${flag} applies to one-shot runs only, not with --sandbox`, { hint: `Drop ${flag}.` });
        }
        const sandbox = await Sandbox.connect(flags.sandbox, connection(flags, context));
        const execution = await sandbox.runCode(source, {
          ...(flags.context !== undefined && { contextId: flags.context }),
          ...(flags.language !== undefined && { language: flags.language }),
          ...(flags.timeout !== undefined && { timeoutMs: flags.timeout }),
          ...output,
        });
        result = execution;
        if (json) event(endEvent({ ...execution, sandboxId: sandbox.sandboxId }));
      } else {
        if (flags.context !== undefined) {
          throw new SandboxError('INVALID_ARGUMENT', '--context needs --sandbox: a context lives in a running sandbox', {
            hint: 'Pass --sandbox ID (see `capsule sandbox list`), or drop --context for a one-shot run.',
          });
        }
        // The engine (and its host code) loads only when the command runs, like `capsule run`.
        const { runCodeOnce } = await import('../../engine/interpreter/run-once.js');
        const once = await runCodeOnce(source, {
          language: flags.language ?? 'python',
          dataDir: flags.dataDir,
          spec: { limits: { ...(flags.memory !== undefined && { memoryBytes: flags.memory }), ...(flags.timeout !== undefined && { wallClockMs: flags.timeout }) } },
          ...output,
        });
        result = once;
        if (json) event(endEvent(once));
      }
      if (!json && result.limit) context.stderr.write(`capsule: limit exceeded (${result.limit.resource}): ${result.limit.message}\n`);
      context.exitCode = result.limit ? LIMIT_EXIT_CODES[result.limit.resource] : result.error ? EXIT_CODE_ERROR : 0;
    });
}

function endEvent(result: Execution & Pick<RunCodeOnceResult, 'sandboxId'> & Partial<Pick<RunCodeOnceResult, 'language'>>): object {
  return {
    type: 'end',
    sandboxId: result.sandboxId,
    contextId: result.contextId,
    ...(result.language !== undefined && { language: result.language }),
    ...(result.executionCount !== undefined && { executionCount: result.executionCount }),
    ...(result.limit && { limit: result.limit }),
    ...(result.error && { error: result.error }),
    ...(result.stdoutTruncated && { stdoutTruncated: true }),
    ...(result.stderrTruncated && { stderrTruncated: true }),
  };
}

/** A result for people: its text, and a note for what a terminal cannot show. */
function describeResult(result: CodeResult): string {
  const rich = (['png', 'jpeg', 'svg', 'html'] as const).filter((field) => result[field] !== undefined);
  const note = rich.length > 0 ? `[${result.isMainResult ? 'result' : 'display'} with ${rich.join(', ')}; use --json to get it]\n` : '';
  const text = result.text !== undefined && !(rich.length > 0 && result.text.startsWith('<Figure')) ? `${result.text}\n` : '';
  return `${text}${note}`;
}

async function readStdin(): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString('utf8');
}
