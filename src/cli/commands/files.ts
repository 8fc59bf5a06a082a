import { createReadStream } from 'node:fs';
import { Command } from 'commander';
import { AbortedError, Sandbox, type FileEntry, type WatchEvent } from '../../sdk/index.js';
import type { CliContext } from '../context.js';
import { durationOption, numberOption } from '../options.js';
import { clientCommand, connection, inheritOutput, printJson, type ClientFlags } from './sandbox.js';

interface WriteFlags extends ClientFlags {
  from?: string;
  data?: string;
}

interface WatchFlags extends ClientFlags {
  recursive?: boolean;
  count?: number;
  duration?: number;
}

/** `capsule files read|write|list|stat|mkdir|move|remove|watch ID PATH`: a sandbox's files, by its own paths. */
export function filesCommand(context: CliContext): Command {
  const files = new Command('files').description("Read and change a sandbox's files (relative paths are under /workspace)");
  const open = async (id: string, flags: ClientFlags) => (await Sandbox.connect(id, connection(flags, context))).files;

  files.addCommand(
    clientCommand('read', 'Print a file (raw bytes; with --json as text or base64)')
      .argument('<id>', 'sandbox id')
      .argument('<path>', 'file path in the sandbox')
      .action(async (id: string, path: string, flags: ClientFlags) => {
        const bytes = Buffer.from(await (await open(id, flags)).read(path, { format: 'bytes' }));
        if (!flags.json) {
          context.stdout.write(bytes);
          return;
        }
        const text = bytes.toString('utf8');
        const isUtf8 = Buffer.from(text, 'utf8').equals(bytes);
        printJson(context, { path, size: bytes.length, encoding: isUtf8 ? 'utf8' : 'base64', content: isUtf8 ? text : bytes.toString('base64') });
      }),
  );

  files.addCommand(
    clientCommand('write', 'Write a file atomically (parents are created) from --data, --from FILE, or stdin')
      .argument('<id>', 'sandbox id')
      .argument('<path>', 'file path in the sandbox')
      .option('--from <file>', 'host file to upload, or - for stdin (the default)')
      .option('--data <text>', 'write this text instead')
      .action(async (id: string, path: string, flags: WriteFlags) => {
        const target = await open(id, flags);
        const source = flags.data ?? (flags.from === undefined || flags.from === '-' ? process.stdin : createReadStream(flags.from));
        printEntry(context, flags, await target.write(path, source));
      }),
  );

  files.addCommand(
    clientCommand('list', 'List a directory')
      .argument('<id>', 'sandbox id')
      .argument('[path]', 'directory in the sandbox', '/workspace')
      .option('--depth <n>', 'levels to descend (default 1)', numberOption('--depth'))
      .action(async (id: string, path: string, flags: ClientFlags & { depth?: number }) => {
        const entries = await (await open(id, flags)).list(path, { depth: flags.depth });
        if (flags.json) return printJson(context, { entries });
        for (const entry of entries) context.stdout.write(`${entry.type.padEnd(7)} ${String(entry.size).padStart(10)}  ${entry.path}\n`);
      }),
  );

  files.addCommand(
    clientCommand('stat', 'Show one entry')
      .argument('<id>', 'sandbox id')
      .argument('<path>', 'path in the sandbox')
      .action(async (id: string, path: string, flags: ClientFlags) => printEntry(context, flags, await (await open(id, flags)).stat(path))),
  );

  files.addCommand(
    clientCommand('mkdir', 'Create a directory and its parents')
      .argument('<id>', 'sandbox id')
      .argument('<path>', 'directory in the sandbox')
      .action(async (id: string, path: string, flags: ClientFlags) => printEntry(context, flags, await (await open(id, flags)).makeDir(path))),
  );

  files.addCommand(
    clientCommand('move', 'Move or rename a file or directory')
      .argument('<id>', 'sandbox id')
      .argument('<source>', 'path in the sandbox')
      .argument('<destination>', 'new path in the sandbox')
      .action(async (id: string, source: string, destination: string, flags: ClientFlags) =>
        printEntry(context, flags, await (await open(id, flags)).move(source, destination)),
      ),
  );

  files.addCommand(
    clientCommand('remove', 'Remove a file, or a directory with its contents')
      .argument('<id>', 'sandbox id')
      .argument('<path>', 'path in the sandbox')
      .action(async (id: string, path: string, flags: ClientFlags) => {
        await (await open(id, flags)).remove(path);
        if (flags.json) printJson(context, { path, removed: true });
      }),
  );

  files.addCommand(
    clientCommand('watch', 'Print changes under a path until interrupted (NDJSON with --json)')
      .argument('<id>', 'sandbox id')
      .argument('[path]', 'directory in the sandbox', '/workspace')
      .option('--recursive', 'also watch subdirectories')
      .option('--count <n>', 'stop after this many events', numberOption('--count'))
      .option('--duration <duration>', 'stop after this long, e.g. 30s', durationOption('--duration'))
      .action(async (id: string, path: string, flags: WatchFlags) => {
        const target = await open(id, flags);
        let seen = 0;
        const stop = new AbortController();
        const onEvent = (event: WatchEvent) => {
          if (flags.count !== undefined && seen >= flags.count) return;
          seen++;
          if (flags.json) printJson(context, event);
          else context.stdout.write(`${event.type.padEnd(6)} ${event.path}\n`);
          if (flags.count !== undefined && seen >= flags.count) stop.abort();
        };
        const onInterrupt = () => stop.abort();
        process.once('SIGINT', onInterrupt);
        const timer = flags.duration === undefined ? undefined : setTimeout(() => stop.abort(), flags.duration);
        try {
          const watch = await target.watch(path, { recursive: flags.recursive === true, onEvent, signal: stop.signal });
          await watch.done;
        } catch (error) {
          // Stopped (--count, --duration, Ctrl-C) before the server had accepted the watch.
          if (!(error instanceof AbortedError && stop.signal.aborted)) throw error;
        } finally {
          clearTimeout(timer);
          process.removeListener('SIGINT', onInterrupt);
        }
      }),
  );

  return inheritOutput(files, context);
}

function printEntry(context: CliContext, flags: ClientFlags, entry: FileEntry): void {
  if (flags.json) return printJson(context, entry);
  const mode = entry.mode.toString(8).padStart(4, '0');
  context.stdout.write(`${entry.type} ${mode} ${entry.size} ${entry.modifiedAt} ${entry.path}${entry.symlinkTarget ? ` -> ${entry.symlinkTarget}` : ''}\n`);
}
