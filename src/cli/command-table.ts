import type { Command } from 'commander';
import type { CliContext } from './context.js';

/** One top-level command: what `capsule --help` lists, and how to load it when it runs. */
export interface CommandEntry {
  name: string;
  /** How `capsule --help` shows it: the name, `[options]` and its arguments. */
  term: string;
  description: string;
  /** Imports the command's module (and only it) and builds the command. */
  load: (context: CliContext) => Promise<Command>;
}

/**
 * Every top-level command. A run loads only the module of the command it names: `capsule run`
 * must not pay for the server, the SDK or SQLite, nor `capsule sandbox` for the engine. The
 * descriptions here are what top-level help shows; a unit test keeps them equal to the commands'.
 */
export const COMMANDS: readonly CommandEntry[] = [
  {
    name: 'run',
    term: 'run [options] <command...>',
    description: 'Run one command in a fresh sandbox and destroy it afterwards',
    load: async (context) => (await import('./commands/run.js')).runCommand(context),
  },
  {
    name: 'run-code',
    term: 'run-code [options] <code>',
    description: 'Run code in a sandbox interpreter (Python by default) and print its output and results',
    load: async (context) => (await import('./commands/run-code.js')).runCodeCommand(context),
  },
  {
    name: 'sandbox',
    term: 'sandbox',
    description: 'Create and drive sandboxes on a Capsule server (capsule serve)',
    load: async (context) => {
      const [{ sandboxCommand }, { sandboxMetricsCommand }, { sandboxSnapshotCommands }] = await Promise.all([
        import('./commands/sandbox.js'),
        import('./commands/artifacts.js'),
        import('./commands/snapshots.js'),
      ]);
      const group = sandboxCommand(context).addCommand(sandboxMetricsCommand(context));
      for (const command of sandboxSnapshotCommands(context)) group.addCommand(command);
      return group;
    },
  },
  {
    name: 'files',
    term: 'files',
    description: "Read and change a sandbox's files (relative paths are under /workspace)",
    load: async (context) => (await import('./commands/files.js')).filesCommand(context),
  },
  {
    name: 'serve',
    term: 'serve [options]',
    description: 'Run the Capsule HTTP API (docs/api.md)',
    load: async (context) => (await import('./commands/serve.js')).serveCommand(context),
  },
  {
    name: 'mcp',
    term: 'mcp [options]',
    description: 'Serve Capsule to an MCP client over stdio (a local server unless CAPSULE_URL names one)',
    load: async (context) => (await import('./commands/mcp.js')).mcpCommand(context),
  },
  {
    name: 'audit',
    term: 'audit',
    description: "Check the server's audit log",
    load: async (context) => (await import('./commands/audit.js')).auditCommand(context),
  },
  {
    name: 'artifacts',
    term: 'artifacts',
    description: "Collect a sandbox's files into the server's artifact store and fetch them by sha256",
    load: async (context) => (await import('./commands/artifacts.js')).artifactsCommand(context),
  },
  {
    name: 'template',
    term: 'template',
    description: 'Templates: root filesystems sandboxes start from (Debian bootstrap, OCI image, Dockerfile)',
    load: async (context) => (await import('./commands/template.js')).templateCommand(context),
  },
  {
    name: 'snapshot',
    term: 'snapshot',
    description: 'List and delete snapshots of your sandboxes',
    load: async (context) => (await import('./commands/snapshots.js')).snapshotCommand(context),
  },
  {
    name: 'volume',
    term: 'volume',
    description: 'Named volumes that outlive sandboxes (mount with sandbox create --volume NAME:/path[:ro])',
    load: async (context) => (await import('./commands/snapshots.js')).volumeCommand(context),
  },
];
