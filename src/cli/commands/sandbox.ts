import { constants } from 'node:os';
import { Command, Option } from 'commander';
import { AbortedError, Sandbox, resolveConfig, type ConnectionOptions, type ExecResult, type SandboxInfo, type SandboxState } from '../../sdk/index.js';
import type { CliContext } from '../context.js';
import { EXIT_COMMAND_NOT_FOUND, EXIT_INTERNAL, LIMIT_EXIT_CODES } from '../exit-codes.js';
import { collect, durationOption, numberOption, parsePairs, parseVolumeFlag } from '../options.js';
import { specFromFlags, withSpecOptions, type SpecFlags } from '../spec-flags.js';

/** Flags every client command takes. */
export interface ClientFlags {
  url?: string;
  apiKey?: string;
  json?: boolean;
}

/** Adds `--url`, `--api-key` and `--json`; they override CAPSULE_URL and CAPSULE_API_KEY. */
export function clientCommand(name: string, description: string): Command {
  return new Command(name)
    .description(description)
    .option('--url <url>', 'Capsule server (default $CAPSULE_URL or http://127.0.0.1:7070)')
    .option('--api-key <key>', 'API key (default $CAPSULE_API_KEY)')
    .option('--json', 'print one JSON object (NDJSON for streams) on stdout');
}

/** The SDK's connection from the flags, then the CLI context's environment. */
export function connection(flags: ClientFlags, context: CliContext): ConnectionOptions {
  const { url, apiKey } = resolveConfig({ url: flags.url, apiKey: flags.apiKey }, context.env);
  return { url, apiKey };
}

/**
 * Nested subcommands do not inherit the program's exit override and output streams (only
 * `.command()` children do): set them so usage errors and help reach the CLI context.
 */
export function inheritOutput(group: Command, context: CliContext): Command {
  for (const command of [group, ...group.commands]) {
    command.exitOverride().configureOutput({
      writeOut: (text) => context.stdout.write(text),
      writeErr: (text) => context.stderr.write(text),
    });
  }
  return group;
}

export function printJson(context: CliContext, value: unknown): void {
  context.stdout.write(`${JSON.stringify(value)}\n`);
}

interface CreateFlags extends ClientFlags, SpecFlags {
  timeout?: number;
  wallClock?: number;
  onTimeout?: string;
  metadata?: string[];
  cwd?: string;
  fromSnapshot?: string;
  volume?: string[];
  waitForCapacity?: number;
}

interface NetworkFlags extends ClientFlags {
  network: 'none' | 'allowlist' | 'internet';
  allow?: string[];
  handle?: string[];
  maxConnections?: number;
  maxConcurrentConnections?: number;
}

interface ListFlags extends ClientFlags {
  state?: string[];
  metadata?: string[];
  limit?: number;
}

interface ExecFlags extends ClientFlags {
  stdin?: boolean;
  cwd?: string;
  env?: string[];
  timeout?: number;
  background?: boolean;
}

/** `capsule sandbox create|get|list|exec|ps|kill|timeout|keepalive|network|pause|resume`: durable sandboxes on a server. */
export function sandboxCommand(context: CliContext): Command {
  const sandbox = new Command('sandbox').description('Create and drive sandboxes on a Capsule server (capsule serve)');

  sandbox.addCommand(
    withSpecOptions(clientCommand('create', 'Create a sandbox and print its id'))
      .option('--timeout <duration>', 'time to live: the sandbox ends this long from now (default 5m)', durationOption('--timeout'))
      .option('--on-timeout <action>', 'what the end of the time to live does: kill (default) or pause')
      .option('--wall-clock <duration>', 'default wall-clock limit of each process (default 30s)', durationOption('--wall-clock'))
      .option('--env <KEY=VALUE>', 'environment variable of every process (repeatable)', collect)
      .option('--metadata <key=value>', 'label to find the sandbox by (repeatable)', collect)
      .option('--cwd <dir>', 'working directory of processes (default /workspace)')
      .option('--from-snapshot <snapshot>', 'start from a snapshot: its root and workspace, its template')
      .option('--volume <NAME:/path[:ro]>', 'mount a named volume (repeatable)', collect)
      .option('--wait-for-capacity <duration>', 'when the server has no room now, wait up to this long for a sandbox to end (e.g. 30s) instead of failing', durationOption('--wait-for-capacity'))
      .addHelpText('after', '\nAny other spec field (limits.tmpBytes, mounts, ...) goes in --spec FILE.json; the flags override it.')
      .action(async (flags: CreateFlags) => {
        const spec = specFromFlags(flags, {
          ttlMs: flags.timeout, onTimeout: flags.onTimeout, cwd: flags.cwd, limits: { wallClockMs: flags.wallClock },
          snapshot: flags.fromSnapshot,
          volumes: flags.volume === undefined ? undefined : flags.volume.map(parseVolumeFlag),
        });
        // The server validates the spec (INVALID_SPEC naming the field), as for any API client.
        const created = await Sandbox.create(spec, {
          ...connection(flags, context),
          metadata: parsePairs('--metadata', flags.metadata ?? []),
          ...(flags.waitForCapacity !== undefined ? { waitForCapacityMs: flags.waitForCapacity } : {}),
        });
        if (flags.json) printJson(context, created.info);
        else context.stdout.write(`${created.sandboxId}\n`);
      }),
  );

  sandbox.addCommand(
    clientCommand('get', 'Show a sandbox')
      .argument('<id>', 'sandbox id')
      .action(async (id: string, flags: ClientFlags) => {
        const found = await Sandbox.connect(id, connection(flags, context));
        printInfo(context, flags, found.info);
      }),
  );

  sandbox.addCommand(
    clientCommand('list', "List this API key's sandboxes, newest first")
      .option('--state <state>', 'only this state (repeatable): starting, running, paused, killed, expired, failed', collect)
      .option('--metadata <key=value>', 'only sandboxes with this label (repeatable)', collect)
      .option('--limit <n>', 'at most this many (default: all)', numberOption('--limit'))
      .action(async (flags: ListFlags) => {
        const sandboxes: SandboxInfo[] = [];
        const query = {
          ...connection(flags, context),
          state: flags.state as SandboxState[] | undefined,
          metadata: parsePairs('--metadata', flags.metadata ?? []),
        };
        for await (const info of Sandbox.listAll(query)) {
          if (flags.limit !== undefined && sandboxes.length >= flags.limit) break;
          sandboxes.push(info);
        }
        if (flags.json) return printJson(context, { sandboxes });
        for (const info of sandboxes) {
          const labels = Object.entries(info.metadata).map(([k, v]) => `${k}=${v}`).join(',');
          context.stdout.write(`${info.sandboxId}  ${info.state.padEnd(8)}  expires ${info.expiresAt}  ${labels}\n`);
        }
      }),
  );

  sandbox.addCommand(
    clientCommand('exec', 'Run a command in a sandbox; exits with its exit status')
      .argument('<id>', 'sandbox id')
      .argument('<command...>', 'the command and its arguments (put -- before them)')
      .option('--cwd <dir>', 'working directory (default the spec cwd)')
      .option('--env <KEY=VALUE>', 'environment variable added for this command (repeatable)', collect)
      .option('--timeout <duration>', 'wall-clock limit of this command', durationOption('--timeout'))
      .option('--background', 'start it and print its pid without waiting')
      .option('--stdin', "send this command's stdin to the command (read to the end first)")
      .action(async (id: string, argv: string[], flags: ExecFlags) => {
        const target = await Sandbox.connect(id, connection(flags, context));
        const options = {
          cwd: flags.cwd,
          env: flags.env && parsePairs('--env', flags.env),
          timeoutMs: flags.timeout,
          stdin: flags.stdin ? await readAll(process.stdin) : undefined,
        };
        if (flags.background) {
          const handle = await target.commands.run(argv, { ...options, background: true });
          if (flags.json) printJson(context, { sandboxId: id, pid: handle.pid });
          else context.stdout.write(`${handle.pid}\n`);
          return;
        }
        const json = flags.json === true;
        // Ctrl-C kills the process in the sandbox too: it would otherwise outlive this client.
        const interrupt = new AbortController();
        const onInterrupt = () => interrupt.abort();
        process.once('SIGINT', onInterrupt);
        let result: ExecResult;
        try {
          result = await target.commands.run(argv, {
            ...options,
            signal: interrupt.signal,
            onStart: json ? (pid) => printJson(context, { type: 'start', sandboxId: id, pid }) : undefined,
            onStdout: (data) => (json ? printJson(context, { type: 'stdout', data }) : context.stdout.write(data)),
            onStderr: (data) => (json ? printJson(context, { type: 'stderr', data }) : context.stderr.write(data)),
            onWarning: (warning) => (json ? printJson(context, { type: 'warning', warning }) : context.stderr.write(`capsule: warning: ${warning.message}\n`)),
          });
        } catch (error) {
          if (!(error instanceof AbortedError && interrupt.signal.aborted)) throw error;
          const message = 'interrupted: the command was killed in the sandbox';
          if (json) printJson(context, { error: { code: 'ABORTED', message } });
          else context.stderr.write(`capsule: ${message}\n`);
          context.exitCode = 130;
          return;
        } finally {
          process.removeListener('SIGINT', onInterrupt);
        }
        if (json) printJson(context, { type: 'exit', result });
        else if (result.outcome === 'limit_exceeded' || result.outcome === 'error') context.stderr.write(`capsule: ${describeEnd(result)}\n`);
        context.exitCode = exitCodeOf(result);
      }),
  );

  sandbox.addCommand(
    clientCommand('ps', 'List the processes of a sandbox')
      .argument('<id>', 'sandbox id')
      .action(async (id: string, flags: ClientFlags) => {
        const processes = await (await Sandbox.connect(id, connection(flags, context))).commands.list();
        if (flags.json) return printJson(context, { processes });
        for (const p of processes) context.stdout.write(`${String(p.pid).padStart(6)}  ${p.running ? 'running' : 'exited '}  ${p.argv.join(' ')}\n`);
      }),
  );

  sandbox.addCommand(
    clientCommand('kill', 'End a sandbox and everything in it')
      .argument('<id>', 'sandbox id')
      .action(async (id: string, flags: ClientFlags) => {
        const target = await Sandbox.connect(id, connection(flags, context));
        printInfo(context, flags, await target.kill());
      }),
  );

  sandbox.addCommand(
    clientCommand('timeout', 'Make a sandbox end DURATION from now (shorter or longer)')
      .argument('<id>', 'sandbox id')
      .argument('<duration>', 'e.g. 10m, 90s', durationOption('<duration>'))
      .action(async (id: string, ttlMs: number, flags: ClientFlags) => {
        const target = await Sandbox.connect(id, connection(flags, context));
        printInfo(context, flags, await target.setTimeout(ttlMs));
      }),
  );

  sandbox.addCommand(
    clientCommand('url', 'Print a signed URL reaching PORT inside the sandbox (HTTP and WebSocket; curl or a browser)')
      .argument('<id>', 'sandbox id')
      .argument('<port>', 'port a server in the sandbox listens on', numberOption('<port>'))
      .option('--expires <duration>', 'how long the URL works (default 1h, at most 7d)', durationOption('--expires'))
      .action(async (id: string, port: number, flags: ClientFlags & { expires?: number }) => {
        const target = await Sandbox.connect(id, connection(flags, context));
        const signed = await target.portUrl(port, flags.expires === undefined ? {} : { expiresInMs: flags.expires });
        context.stdout.write(flags.json ? `${JSON.stringify(signed)}\n` : `${signed.hostUrl ?? signed.url}\n`);
      }),
  );

  sandbox.addCommand(
    clientCommand('keepalive', "Extend a sandbox's life by its spec's TTL from now")
      .argument('<id>', 'sandbox id')
      .action(async (id: string, flags: ClientFlags) => {
        const target = await Sandbox.connect(id, connection(flags, context));
        printInfo(context, flags, await target.keepAlive());
      }),
  );

  sandbox.addCommand(
    clientCommand('network', "Replace a running sandbox's network policy (new connections follow it at once)")
      .argument('<id>', 'sandbox id')
      .addOption(new Option('--network <mode>', 'network access').choices(['none', 'allowlist', 'internet']).makeOptionMandatory())
      .option('--allow <domain-or-cidr>', 'allowed destination (repeatable, with --network allowlist)', collect)
      .option('--handle <name>', 'credential-broker handle the sandbox may use (repeatable)', collect)
      .option('--max-connections <n>', 'outbound connections over its lifetime (default 4096)', numberOption('--max-connections'))
      .option('--max-concurrent-connections <n>', 'connections through the egress proxy open at once (default 256)', numberOption('--max-concurrent-connections'))
      .action(async (id: string, flags: NetworkFlags) => {
        const target = await Sandbox.connect(id, connection(flags, context));
        const info = await target.setNetwork({
          mode: flags.network,
          allow: flags.allow ?? [],
          handles: flags.handle ?? [],
          ...(flags.maxConnections !== undefined && { maxConnections: flags.maxConnections }),
          ...(flags.maxConcurrentConnections !== undefined && { maxConcurrentConnections: flags.maxConcurrentConnections }),
        });
        if (flags.json) return printJson(context, info);
        const { mode, allow, handles } = info.spec.network;
        context.stdout.write(`network   ${mode}${allow.length > 0 ? ` allow ${allow.join(',')}` : ''}${handles.length > 0 ? ` handles ${handles.join(',')}` : ''}\n`);
      }),
  );

  sandbox.addCommand(
    clientCommand('pause', 'Pause a sandbox (keeps memory unless --no-memory); says whether it survives a server restart')
      .argument('<id>', 'sandbox id')
      .option('--no-memory', 'end the processes and keep only the files')
      .action(async (id: string, flags: ClientFlags & { memory: boolean }) => {
        const target = await Sandbox.connect(id, connection(flags, context));
        printInfo(context, flags, await target.pause({ keepMemory: flags.memory }));
      }),
  );

  sandbox.addCommand(
    clientCommand('resume', 'Continue a paused sandbox')
      .argument('<id>', 'sandbox id')
      .action(async (id: string, flags: ClientFlags) => {
        const target = await Sandbox.connect(id, connection(flags, context));
        printInfo(context, flags, await target.resume());
      }),
  );

  return inheritOutput(sandbox, context);
}

function printInfo(context: CliContext, flags: ClientFlags, info: SandboxInfo): void {
  if (flags.json) return printJson(context, info);
  const lines = [
    `sandbox   ${info.sandboxId}`,
    `state     ${info.state}${info.endReason ? ` (${info.endReason})` : ''}`,
    `backend   ${info.backend}`,
    `created   ${info.createdAt}`,
    `expires   ${info.expiresAt}`,
    ...(info.pause
      ? [`paused    ${info.pause.keepsMemory ? 'memory kept' : 'files only'}, ${info.pause.survivesRestart ? 'survives a server restart' : 'lost if the server restarts'}`]
      : []),
    ...Object.entries(info.metadata).map(([k, v]) => `metadata  ${k}=${v}`),
  ];
  context.stdout.write(`${lines.join('\n')}\n`);
}

async function readAll(stream: NodeJS.ReadableStream): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of stream) chunks.push(typeof chunk === 'string' ? Buffer.from(chunk) : chunk);
  return Buffer.concat(chunks);
}

/** Same convention as `capsule run`: the command's own status, 128+N for a signal, or a limit's code. */
function exitCodeOf(result: ExecResult): number {
  if (result.outcome === 'limit_exceeded' && result.limit) return LIMIT_EXIT_CODES[result.limit.resource];
  if (result.outcome === 'error') return result.error?.code === 'EXEC_FAILED' ? EXIT_COMMAND_NOT_FOUND : EXIT_INTERNAL;
  if (result.exitCode !== null) return result.exitCode;
  return 128 + ((constants.signals as Record<string, number>)[result.signal ?? ''] ?? 0);
}

function describeEnd(result: ExecResult): string {
  if (result.outcome === 'limit_exceeded') return `limit exceeded (${result.limit?.resource}): ${result.limit?.message}`;
  return `error ${result.error?.code}: ${result.error?.message}`;
}
