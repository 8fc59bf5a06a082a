import { Command, Option } from 'commander';
import { Sandbox, Snapshots, Volumes, type SnapshotInfo, type VolumeInfo } from '../../sdk/index.js';
import type { CliContext } from '../context.js';
import { bytesOption, numberOption } from '../options.js';
import { clientCommand, connection, inheritOutput, printJson, type ClientFlags } from './sandbox.js';

interface SnapshotFlags extends ClientFlags {
  name?: string;
  mode?: 'filesystem' | 'full';
}

function describeSnapshot(s: SnapshotInfo): string {
  return `${s.snapshotId}  ${s.createdAt}  ${String(s.sizeBytes ?? '-').padStart(12)}  of ${s.sandboxId}${s.parentSnapshotId ? ` (from ${s.parentSnapshotId})` : ''}  ${s.template}${s.name ? `  "${s.name}"` : ''}`;
}

function describeVolume(v: VolumeInfo): string {
  return `${v.name.padEnd(24)}  ${String(v.usedBytes ?? '-').padStart(12)} / ${String(v.sizeBytes).padStart(12)}${v.shared ? '  shared' : ''}`;
}

/** `capsule sandbox snapshot|fork|changes ID` (added to the sandbox group). */
export function sandboxSnapshotCommands(context: CliContext): Command[] {
  const commands = [
    clientCommand('snapshot', 'Snapshot a sandbox (root and workspace at one instant) and print the snapshot id')
      .argument('<id>', 'sandbox id')
      .option('--name <name>', 'a label for the snapshot')
      .option('--mode <mode>', 'filesystem (default) or full (processes and memory, where the backend can)')
      .action(async (id: string, flags: SnapshotFlags) => {
        const snapshot = await (await Sandbox.connect(id, connection(flags, context))).snapshot({ name: flags.name, mode: flags.mode });
        if (flags.json) printJson(context, snapshot);
        else context.stdout.write(`${snapshot.snapshotId}\n`);
      }),
    clientCommand('fork', 'Make N sandboxes from one snapshot of this one; prints one line per fork (its id, or its error)')
      .argument('<id>', 'sandbox id')
      .requiredOption('--count <n>', 'how many forks (1 to 100)', numberOption('--count'))
      .addOption(new Option('--mode <mode>', 'filesystem (default), or full: each fork resumes the processes and memory (gvisor)').choices(['filesystem', 'full']))
      .action(async (id: string, flags: ClientFlags & { count: number; mode?: 'filesystem' | 'full' }) => {
        const result = await (await Sandbox.connect(id, connection(flags, context))).fork(flags.count, { mode: flags.mode });
        if (flags.json) return printJson(context, { snapshot: result.snapshot, forks: result.forks.map((f) => ('sandbox' in f ? { sandbox: f.sandbox.info } : { error: { code: f.error.code, message: f.error.message } })) });
        for (const fork of result.forks) context.stdout.write('sandbox' in fork ? `${fork.sandbox.sandboxId}\n` : `error ${fork.error.code}: ${fork.error.message}\n`);
      }),
    clientCommand('changes', 'List what a sandbox changed against the snapshot or template it came from')
      .argument('<id>', 'sandbox id')
      .option('--since <snapshot>', 'compare against this snapshot instead')
      .action(async (id: string, flags: ClientFlags & { since?: string }) => {
        const changes = await (await Sandbox.connect(id, connection(flags, context))).changes({ since: flags.since });
        if (flags.json) return printJson(context, changes);
        const sign = { added: 'A', modified: 'M', deleted: 'D' } as const;
        for (const c of changes.changes) context.stdout.write(`${sign[c.kind]} ${c.type.padEnd(7)} ${String(c.sizeBytes).padStart(10)}  ${c.path}${c.target !== undefined ? ` -> ${c.target}` : ''}\n`);
        if (changes.truncated) context.stderr.write('capsule: more paths changed than one answer lists\n');
      }),
  ];
  return commands.map((command) => inheritOutput(command, context));
}

/** `capsule snapshot ls|rm`. */
export function snapshotCommand(context: CliContext): Command {
  const group = new Command('snapshot').description('List and delete snapshots of your sandboxes');
  group.addCommand(
    clientCommand('ls', 'List your snapshots, oldest first').action(async (flags: ClientFlags) => {
      const list = await Snapshots.list(connection(flags, context));
      if (flags.json) return printJson(context, { snapshots: list });
      for (const s of list) context.stdout.write(`${describeSnapshot(s)}\n`);
    }),
  );
  group.addCommand(
    clientCommand('rm', 'Delete a snapshot and its data (refused while a live sandbox was made from it)')
      .argument('<snapshot>', 'snapshot id')
      .action(async (id: string, flags: ClientFlags) => {
        await Snapshots.delete(id, connection(flags, context));
        if (flags.json) printJson(context, { deleted: id });
      }),
  );
  return inheritOutput(group, context);
}

/** `capsule volume create|ls|rm`. */
export function volumeCommand(context: CliContext): Command {
  const group = new Command('volume').description('Named volumes that outlive sandboxes (mount with sandbox create --volume NAME:/path[:ro])');
  group.addCommand(
    clientCommand('create', 'Create a named volume with a size limit')
      .argument('<name>', 'volume name (lowercase letters, digits, "._-")')
      .requiredOption('--size <size>', 'size limit, e.g. 1GiB', bytesOption('--size'))
      .option('--shared', 'let several sandboxes mount it writable at once')
      .action(async (name: string, flags: ClientFlags & { size: number; shared?: boolean }) => {
        const volume = await Volumes.create(name, flags.size, { ...connection(flags, context), shared: flags.shared === true });
        if (flags.json) printJson(context, volume);
        else context.stdout.write(`${volume.name}\n`);
      }),
  );
  group.addCommand(
    clientCommand('ls', 'List your volumes with what each holds').action(async (flags: ClientFlags) => {
      const list = await Volumes.list(connection(flags, context));
      if (flags.json) return printJson(context, { volumes: list });
      for (const v of list) context.stdout.write(`${describeVolume(v)}\n`);
    }),
  );
  group.addCommand(
    clientCommand('rm', 'Delete a volume and its data (refused while a live sandbox mounts it)')
      .argument('<name>', 'volume name')
      .action(async (name: string, flags: ClientFlags) => {
        await Volumes.delete(name, connection(flags, context));
        if (flags.json) printJson(context, { deleted: name });
      }),
  );
  return inheritOutput(group, context);
}
