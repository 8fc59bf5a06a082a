import { Command, CommanderError } from 'commander';
import { isSandboxError } from '../errors/index.js';
import { runCommand } from './commands/run.js';
import { runCodeCommand } from './commands/run-code.js';
import { filesCommand } from './commands/files.js';
import { sandboxCommand } from './commands/sandbox.js';
import { serveCommand } from './commands/serve.js';
import { auditCommand } from './commands/audit.js';
import { artifactsCommand, sandboxMetricsCommand } from './commands/artifacts.js';
import type { CliContext } from './context.js';
import { EXIT_INTERNAL, EXIT_USAGE, exitCodeForError } from './exit-codes.js';

/** Builds the `capsule` program. Each subcommand lives in commands/. */
export function buildProgram(context: CliContext): Command {
  const program = new Command('capsule')
    .description('Capsule: sandboxes for AI agents')
    .version('0.1.0')
    .exitOverride()
    .configureOutput({
      writeOut: (text) => context.stdout.write(text),
      writeErr: (text) => context.stderr.write(text),
    });
  program.addCommand(runCommand(context));
  program.addCommand(runCodeCommand(context));
  program.addCommand(sandboxCommand(context).addCommand(sandboxMetricsCommand(context)));
  program.addCommand(filesCommand(context));
  program.addCommand(serveCommand(context));
  program.addCommand(auditCommand(context));
  program.addCommand(artifactsCommand(context));
  for (const command of program.commands) command.exitOverride();
  return program;
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
    await buildProgram(ctx).parseAsync(argv);
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
