import { Command, Option } from 'commander';
import type { RunCodeOnceResult } from '../../engine/interpreter/run-once.js';
import { INTERPRETER_LANGUAGES, type InterpreterLanguage, type Result } from '../../engine/interpreter/types.js';
import { bytesOption, durationOption } from '../options.js';
import { LIMIT_EXIT_CODES } from '../exit-codes.js';
import type { CliContext } from '../context.js';

interface RunCodeFlags {
  language: InterpreterLanguage;
  json?: boolean;
  timeout?: number;
  memory?: number;
  dataDir?: string;
}

/** Exit status when the code raised an exception. */
const EXIT_CODE_ERROR = 1;

/**
 * `capsule run-code`: one-shot code in a fresh sandbox's interpreter context. (Running in a
 * live sandbox's context, `--sandbox ID --context ID`, needs the server and its SDK.)
 */
export function runCodeCommand(context: CliContext): Command {
  return new Command('run-code')
    .description('Run code in a fresh sandbox interpreter (Python by default) and print its output and results')
    .addOption(new Option('--language <language>', 'interpreter').choices([...INTERPRETER_LANGUAGES]).default('python'))
    .option('--timeout <duration>', 'wall-clock limit of the code, e.g. 10s (default 30s)', durationOption('--timeout'))
    .option('--memory <size>', 'sandbox memory limit, e.g. 1GiB (default 512MiB)', bytesOption('--memory'))
    .option('--data-dir <dir>', 'Capsule data directory (default /var/lib/capsule)')
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
      // The engine (and its host code) loads only when the command runs, like `capsule run`.
      const { runCodeOnce } = await import('../../engine/interpreter/run-once.js');
      const result = await runCodeOnce(source, {
        language: flags.language,
        dataDir: flags.dataDir,
        spec: { limits: { ...(flags.memory !== undefined && { memoryBytes: flags.memory }), ...(flags.timeout !== undefined && { wallClockMs: flags.timeout }) } },
        onStdout: (text) => (json ? event({ type: 'stdout', text }) : context.stdout.write(text)),
        onStderr: (text) => (json ? event({ type: 'stderr', text }) : context.stderr.write(text)),
        onResult: (r) => (json ? event({ type: 'result', ...r }) : context.stdout.write(describeResult(r))),
        onError: (e) => (json ? event({ type: 'error', ...e }) : context.stderr.write(`${e.traceback || `${e.name}: ${e.value}`}\n`)),
      });
      if (json) event(endEvent(result));
      else if (result.limit) context.stderr.write(`capsule: limit exceeded (${result.limit.resource}): ${result.limit.message}\n`);
      context.exitCode = result.limit ? LIMIT_EXIT_CODES[result.limit.resource] : result.error ? EXIT_CODE_ERROR : 0;
    });
}

function endEvent(result: RunCodeOnceResult): object {
  return {
    type: 'end',
    sandboxId: result.sandboxId,
    contextId: result.contextId,
    language: result.language,
    ...(result.executionCount !== undefined && { executionCount: result.executionCount }),
    ...(result.limit && { limit: result.limit }),
    ...(result.error && { error: result.error }),
    ...(result.stdoutTruncated && { stdoutTruncated: true }),
    ...(result.stderrTruncated && { stderrTruncated: true }),
  };
}

/** A result for people: its text, and a note for what a terminal cannot show. */
function describeResult(result: Result): string {
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
