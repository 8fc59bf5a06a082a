import { Command, Option } from 'commander';
import { Sandbox, Snapshots, Volumes, type SnapshotInfo, type VolumeInfo } from '../../sdk/index.js';
import { SandboxError } from '../../errors/index.js';
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
      .option('--include-volumes', 'also keep a copy of each volume the sandbox mounts (volume create --from SNAPSHOT:VOLUME makes a volume of one)')
      .action(async (id: string, flags: SnapshotFlags & { includeVolumes?: boolean }) => {
        const sandbox = await Sandbox.connect(id, connection(flags, context));
        const snapshot = await sandbox.snapshot({ name: flags.name, mode: flags.mode, ...(flags.includeVolumes ? { includeVolumes: true } : {}) });
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

/** `--from SNAPSHOT:VOLUME`. */
function copyRef(text: string): { snapshotId: string; volume: string } {
  const at = text.indexOf(':');
  if (at <= 0 || at === text.length - 1) {
    throw new SandboxError('INVALID_ARGUMENT', `--from wants SNAPSHOT:VOLUME, not "${text}"`, { hint: 'For example --from snap_abc...:data (see capsule snapshot ls --json for the volumes a snapshot kept).' });
  }
  return { snapshotId: text.slice(0, at), volume: text.slice(at + 1) };
}

function requiredSize(size: number | undefined): number {
  if (size === undefined) throw new SandboxError('INVALID_ARGUMENT', 'volume create needs --size', { hint: 'Give --size (e.g. 1GiB), or --from SNAPSHOT:VOLUME to copy a volume a snapshot kept.' });
  return size;
}

/** `capsule volume create|ls|rm`. */
export function volumeCommand(context: CliContext): Command {
  const group = new Command('volume').description('Named volumes that outlive sandboxes (mount with sandbox create --volume NAME:/path[:ro])');
  group.addCommand(
    clientCommand('create', 'Create a named volume with a size limit, empty or a copy a snapshot kept')
      .argument('<name>', 'volume name (lowercase letters, digits, "._-")')
      .option('--size <size>', 'size limit, e.g. 1GiB (required unless --from: then the copied volume\'s)', bytesOption('--size'))
      .option('--shared', 'let several sandboxes mount it writable at once')
      .option('--from <snapshot:volume>', 'start as the copy of VOLUME that SNAPSHOT kept (sandbox snapshot --include-volumes)')
      .action(async (name: string, flags: ClientFlags & { size?: number; shared?: boolean; from?: string }) => {
        const options = { ...connection(flags, context), shared: flags.shared === true };
        const volume = flags.from !== undefined
          ? await Volumes.createFrom(name, copyRef(flags.from), { ...options, ...(flags.size !== undefined ? { sizeBytes: flags.size } : {}) })
          : await Volumes.create(name, requiredSize(flags.size), options);
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
