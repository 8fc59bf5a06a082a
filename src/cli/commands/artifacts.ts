import { createHash } from 'node:crypto';
import { createWriteStream } from 'node:fs';
import { Readable, Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { Command } from 'commander';
import { Artifacts, Sandbox, type ArtifactRef } from '../../sdk/index.js';
import type { CliContext } from '../context.js';
import { bytesOption } from '../options.js';
import { clientCommand, connection, inheritOutput, printJson, type ClientFlags } from './sandbox.js';

interface CollectFlags extends ClientFlags {
  dir?: string;
  maxFileBytes?: number;
  maxTotalBytes?: number;
}

function describeRef(ref: ArtifactRef): string {
  if ('skipped' in ref) return `skipped  ${ref.skipped.padEnd(13)} ${ref.size === undefined ? '' : `${ref.size} `}${ref.path}`;
  return `${ref.sha256}  ${String(ref.size).padStart(10)}  ${ref.path}`;
}

/** `capsule artifacts collect|list|get|delete`: results by reference. */
export function artifactsCommand(context: CliContext): Command {
  const artifacts = new Command('artifacts').description("Collect a sandbox's files into the server's artifact store and fetch them by sha256");

  artifacts.addCommand(
    clientCommand('collect', 'Copy the files of a sandbox directory into the store; prints one reference per file')
      .argument('<id>', 'sandbox id')
      .option('--dir <dir>', 'directory in the sandbox (default /workspace/output)')
      .option('--max-file-bytes <size>', 'skip larger files (default 64MiB)', bytesOption('--max-file-bytes'))
      .option('--max-total-bytes <size>', 'stop copying past this total (default 128MiB)', bytesOption('--max-total-bytes'))
      .action(async (id: string, flags: CollectFlags) => {
        const sandbox = await Sandbox.connect(id, connection(flags, context));
        const collection = await sandbox.artifacts.collect({ dir: flags.dir, maxFileBytes: flags.maxFileBytes, maxTotalBytes: flags.maxTotalBytes });
        if (flags.json) return printJson(context, collection);
        for (const ref of collection.artifacts) context.stdout.write(`${describeRef(ref)}\n`);
        if (collection.truncated) context.stderr.write('capsule: some files were left out by the total or file-count cap\n');
      }),
  );

  artifacts.addCommand(
    clientCommand('list', 'List the artifacts collected from a sandbox (also after it ended)')
      .argument('<id>', 'sandbox id')
      .action(async (id: string, flags: ClientFlags) => {
        const list = await Artifacts.list({ ...connection(flags, context), sandboxId: id });
        if (flags.json) return printJson(context, { artifacts: list });
        for (const a of list) context.stdout.write(`${a.sha256}  ${String(a.size).padStart(10)}  ${a.expiresAt}  ${a.path}\n`);
      }),
  );

  artifacts.addCommand(
    clientCommand('get', 'Download an artifact by sha256 (to stdout, or --out FILE)')
      .argument('<sha256>', 'sha256 or capsule://artifacts/<sha256>')
      .option('--out <file>', 'write to this file (created or replaced)')
      .action(async (ref: string, flags: ClientFlags & { out?: string }) => {
        const stream = await Artifacts.download(ref, { ...connection(flags, context), format: 'stream' });
        const hash = createHash('sha256');
        let size = 0;
        const counting = new Transform({
          transform(chunk: Buffer, _encoding, callback) {
            hash.update(chunk);
            size += chunk.length;
            callback(null, chunk);
          },
        });
        const target = flags.out === undefined ? context.stdout : createWriteStream(flags.out);
        await pipeline(Readable.fromWeb(stream), counting, target, { end: flags.out !== undefined });
        const sha256 = hash.digest('hex');
        if (flags.json && flags.out !== undefined) printJson(context, { path: flags.out, size, sha256 });
        else if (flags.out !== undefined) context.stderr.write(`${size} bytes, sha256 ${sha256} -> ${flags.out}\n`);
      }),
  );

  artifacts.addCommand(
    clientCommand('delete', "Delete this tenant's artifacts with a sha256")
      .argument('<sha256>', 'sha256 or capsule://artifacts/<sha256>')
      .action(async (ref: string, flags: ClientFlags) => {
        await Artifacts.delete(ref, connection(flags, context));
        if (flags.json) printJson(context, { deleted: ref });
      }),
  );
  return inheritOutput(artifacts, context);
}

/** `capsule sandbox metrics ID`: usage samples over time (added to the sandbox group). */
export function sandboxMetricsCommand(context: CliContext): Command {
  const command = clientCommand('metrics', "Show a sandbox's CPU, memory and disk use over time (a sample every 5 s)")
    .argument('<id>', 'sandbox id')
    .action(async (id: string, flags: ClientFlags) => {
      const samples = await (await Sandbox.connect(id, connection(flags, context))).getMetrics();
      if (flags.json) return printJson(context, { samples });
      context.stdout.write('timestamp                 cpu%    cpuMs      memory       peak        disk\n');
      for (const s of samples) {
        const cells = [s.cpuUsedPct.toFixed(1).padStart(6), String(s.cpuTimeMs).padStart(8), String(s.memoryBytes).padStart(11), String(s.memoryPeakBytes).padStart(10), String(s.diskBytes ?? '-').padStart(11)];
        context.stdout.write(`${s.timestamp}  ${cells.join(' ')}\n`);
      }
    });
  return inheritOutput(command, context);
}
