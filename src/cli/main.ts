import { Command, CommanderError } from 'commander';
import { isSandboxError } from '../errors/index.js';
import { COMMANDS } from './command-table.js';
import type { CliContext } from './context.js';
import { EXIT_INTERNAL, EXIT_USAGE, exitCodeForError } from './exit-codes.js';
import { capsuleVersion } from './version.js';

/**
 * Builds the `capsule` program for `argv`. Only the command that argv names is loaded (with
 * `help NAME`, that one); without one, every command is listed from the command table so that
 * help and "unknown command" need no command module at all.
 */
export async function buildProgram(context: CliContext, argv: readonly string[] = []): Promise<Command> {
  const program = new Command('capsule')
    .description('Capsule: sandboxes for AI agents')
    .version(capsuleVersion())
    .exitOverride()
    .configureOutput({
      writeOut: (text) => context.stdout.write(text),
      writeErr: (text) => context.stderr.write(text),
    });
  const entry = COMMANDS.find((command) => command.name === commandName(argv));
  if (entry) {
    program.addCommand(await entry.load(context));
  } else {
    const terms = new Map(COMMANDS.map((command) => [command.name, command.term]));
    const defaultTerm = program.createHelp().subcommandTerm.bind(program.createHelp());
    program.configureHelp({ subcommandTerm: (command) => terms.get(command.name()) ?? defaultTerm(command) });
    for (const command of COMMANDS) program.command(command.name).description(command.description);
  }
  for (const command of program.commands) command.exitOverride();
  return program;
}

/** The command argv names: its first operand (`capsule` takes no option with a value), or the one after `help`. */
export function commandName(argv: readonly string[]): string | undefined {
  const operands = argv.slice(2).filter((arg) => !arg.startsWith('-'));
  return operands[0] === 'help' ? operands[1] : operands[0];
}

/** Runs the CLI and returns the exit status; never throws. */
export async function main(argv: string[], context?: Partial<CliContext>): Promise<number> {
  const ctx: CliContext = {
    stdout: context?.stdout ?? process.stdout,
    stderr: context?.stderr ?? process.stderr,
    env: context?.env ?? process.env,
    exitCode: 0,
  };
  // --json after `--` belongs to the sandboxed command, not to capsule.
  const own = argv.includes('--') ? argv.slice(0, argv.indexOf('--')) : argv;
  const json = own.includes('--json');
  try {
    await (await buildProgram(ctx, own)).parseAsync(argv);
    return ctx.exitCode;
  } catch (error) {
    if (error instanceof CommanderError) {
      if (error.exitCode === 0) return 0;
      // commander already wrote its message to stderr; --json callers also get the error shape.
      if (json) ctx.stdout.write(`${JSON.stringify({ error: { code: 'INVALID_ARGUMENT', message: error.message } })}\n`);
      return EXIT_USAGE;
    }
    if (isSandboxError(error)) {
      if (json) ctx.stdout.write(`${JSON.stringify({ error: error.toJSON() })}\n`);
      ctx.stderr.write(`capsule: ${error.code}: ${error.message}\n${error.hint ? `  hint: ${error.hint}\n` : ''}`);
      return exitCodeForError(error.code);
    }
    ctx.stderr.write(`capsule: internal error: ${(error as Error).stack ?? String(error)}\n`);
    return EXIT_INTERNAL;
  }
}
