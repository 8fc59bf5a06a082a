import { Command } from 'commander';
import { DEFAULT_DATA_DIR } from '../../host/host-env.host.js';
import { SandboxError } from '../../errors/index.js';
import { bytesOption, collect, durationOption, numberOption } from '../options.js';
import type { CliContext } from '../context.js';

interface ServeFlags {
  port: number;
  host: string;
  dataDir: string;
  maxSandboxes: number;
  warmPool: number;
  cgroupFavordynmods?: boolean;
  logLevel: string;
  deny?: string[];
  mountRoot?: string[];
  egressIdleTimeout?: number;
  logRetention?: number;
  defaultTemplate?: string;
  tenantDiskQuota?: number;
  diskOvercommit?: number;
  maxBuildsPerTenant?: number;
  volumeSize?: number;
  publicDomain?: string;
  supervise?: boolean;
  stopSandboxes?: boolean;
  maxLiveSandboxes?: number;
  memoryOvercommit?: number;
  memoryReserve?: number;
  pidsOvercommit?: number;
  maxCapacityWait?: number;
}

/** `--mount-root NAME=PATH` flags as a map; a flag without `=` or a name given twice is refused. */
function parseMountRoots(flags: readonly string[]): Record<string, string> {
  const roots: Record<string, string> = {};
  for (const flag of flags) {
    const at = flag.indexOf('=');
    const name = flag.slice(0, at);
    if (at <= 0 || name in roots) {
      throw new SandboxError('INVALID_ARGUMENT', `--mount-root ${flag}: ${at <= 0 ? 'write NAME=PATH' : `root ${name} is named twice`}`, {
        details: { field: '--mount-root', value: flag },
        hint: 'Write --mount-root datasets=/srv/datasets, once per root.',
      });
    }
    roots[name] = flag.slice(at + 1);
  }
  return roots;
}

/** `CAPSULE_FAIR_TURN_BUDGET_MS` (a diagnostic: 0 turns fair turns off, to compare). */
function fairTurnBudget(env: NodeJS.ProcessEnv): { fairTurnBudgetMs?: number } {
  const value = env.CAPSULE_FAIR_TURN_BUDGET_MS;
  if (value === undefined || value === '') return {};
  const ms = Number(value);
  if (!Number.isFinite(ms) || ms < 0) {
    throw new SandboxError('INVALID_ARGUMENT', `CAPSULE_FAIR_TURN_BUDGET_MS must be a number of milliseconds, 0 or more, not "${value}"`, {
      details: { field: 'CAPSULE_FAIR_TURN_BUDGET_MS', value },
      hint: 'Unset it (the default, 2 ms), or set 0 to start every request at once.',
    });
  }
  return { fairTurnBudgetMs: ms };
}

/**
 * `capsule serve`: the HTTP API. Prints `URL:` and `API key:` lines on stdout; JSON logs go to
 * stderr. Each sandbox is held by a supervisor of its own, so sandboxes outlive the server: a
 * SIGTERM or SIGINT stop leaves them running and says which (the next start reattaches), a crash
 * or an upgrade does not touch them. `--stop-sandboxes` makes a stop kill them (records kept);
 * `--no-supervise` ties every sandbox to the server process again (they die with it).
 */
export function serveCommand(context: CliContext): Command {
  return new Command('serve')
    .description('Run the Capsule HTTP API (docs/api.md)')
    .option('--port <n>', 'TCP port (0 picks a free one)', numberOption('--port'), 7070)
    .option('--host <address>', 'address to listen on', '127.0.0.1')
    .option('--data-dir <dir>', 'Capsule data directory', DEFAULT_DATA_DIR)
    .option('--max-sandboxes <n>', 'concurrent sandboxes per tenant', numberOption('--max-sandboxes'), 20)
    .option('--max-live-sandboxes <n>', 'live sandboxes on this server, every tenant\'s and the warm pool\'s (default 1000)', numberOption('--max-live-sandboxes'))
    .option('--memory-overcommit <ratio>', 'how far the memory limits of live sandboxes may exceed host memory less the reserve (default 1: never)', numberOption('--memory-overcommit'))
    .option('--memory-reserve <size>', 'host memory kept for the server and the OS, never promised to sandboxes (default 2GiB)', bytesOption('--memory-reserve'))
    .option('--pids-overcommit <ratio>', 'how far the pids limits of live sandboxes may exceed the host\'s task ids (default 1: never)', numberOption('--pids-overcommit'))
    .option('--max-capacity-wait <ms>', 'the longest waitForCapacityMs a create may ask for (default 60000)', numberOption('--max-capacity-wait'))
    .option('--log-level <level>', 'fatal, error, warn, info, debug', 'info')
    .option('--warm-pool <n>', 'sandboxes kept started ahead for creates with no network and no mounts', numberOption('--warm-pool'), 2)
    .option('--default-template <ref>', "the template of sandboxes that name none: a public template (capsule template ls), or host (the host's /usr, read-only; the default)")
    .option('--mount-root <name=path>', 'a host directory tenants may mount read-only, by name, once their key is granted it (repeatable)', collect)
    .option('--log-retention <duration>', "how long an ended sandbox's process output logs and records are kept, e.g. 30m (default 1h)", durationOption('--log-retention'))
    .option('--egress-idle-timeout <ms>', 'close a sandbox connection through the egress proxy after this long with no bytes either way (default 300000)', numberOption('--egress-idle-timeout'))
    .option('--tenant-disk-quota <size>', "each tenant's disk quota over its workspaces (by their disk limits), logs, artifacts, snapshots, volumes and template layers, e.g. 20GiB (default 20GiB)", bytesOption('--tenant-disk-quota'))
    .option('--max-builds-per-tenant <n>', 'template builds one tenant may run at once (default 2)', numberOption('--max-builds-per-tenant'))
    .option('--disk-overcommit <ratio>', 'how far the disk limits of live sandboxes may exceed what the workspace volume holds (default 1: never)', numberOption('--disk-overcommit'))
    .option('--volume-size <size>', 'size of the workspace volume image when it is first made (default 32GiB)', bytesOption('--volume-size'))
    .option('--no-cgroup-favordynmods', "leave the cgroup2 mount's options as they are (by default Capsule turns on favordynmods: a sandbox start then joins its cgroups in microseconds instead of waiting for an RCU grace period)")
    .option('--public-domain <domain>', 'port P of sandbox ID is also served at http://P-ID.DOMAIN/ (point wildcard DNS *.DOMAIN at this server)')
    .option('--supervise', 'sandboxes outlive the server (the default): a supervisor per sandbox holds it, the next start reattaches; a stop leaves them running')
    .option('--no-supervise', 'sandboxes die with the server process (a crash or a stop ends them; the next start recovers their files only)')
    .option('--stop-sandboxes', 'SIGTERM/SIGINT kill every sandbox instead of leaving them running (records kept)')
    .option('--deny <domain-or-cidr>', 'operator deny list: no sandbox reaches it, whatever its allow list (repeatable; a domain covers its subdomains; also $CAPSULE_EGRESS_DENY, comma-separated)', collect)
    .addHelpText(
      'after',
      '\nThe operator key comes from CAPSULE_API_KEY (cap_ + 40 hex); without it one is generated at the first start and printed once.' +
        '\nMount roots: a spec mounts { root: NAME, subpath, sandboxPath }; mint keys with mountRoots: [NAME] (the operator key may use all).' +
        '\nCredential-broker handles and secrets live in DATA_DIR/broker (handles.json, secrets/NAME, mode 0600); see docs/api.md.',
    )
    .action(async (flags: ServeFlags) => {
      // Loaded here: the server's modules are heavy, and other commands need none of them.
      const [{ startServer }, { registerMcpHttp }] = await Promise.all([import('../../server/bootstrap.js'), import('../../mcp/http.js')]);
      const server = await startServer({
        dataDir: flags.dataDir,
        port: flags.port,
        host: flags.host,
        env: context.env,
        maxSandboxesPerTenant: flags.maxSandboxes,
        admission: {
          ...(flags.maxLiveSandboxes !== undefined && { maxSandboxes: flags.maxLiveSandboxes }),
          ...(flags.memoryOvercommit !== undefined && { memoryOvercommit: flags.memoryOvercommit }),
          ...(flags.memoryReserve !== undefined && { memoryReserveBytes: flags.memoryReserve }),
          ...(flags.pidsOvercommit !== undefined && { pidsOvercommit: flags.pidsOvercommit }),
          ...(flags.maxCapacityWait !== undefined && { maxWaitMs: flags.maxCapacityWait }),
        },
        warmPool: flags.warmPool,
        tenantDiskQuotaBytes: flags.tenantDiskQuota,
        diskOvercommit: flags.diskOvercommit,
        maxBuildsPerTenant: flags.maxBuildsPerTenant,
        volumeBytes: flags.volumeSize,
        favorCgroupMigrations: flags.cgroupFavordynmods !== false,
        operatorDeny: [...(flags.deny ?? []), ...(context.env.CAPSULE_EGRESS_DENY ?? '').split(',').map((e) => e.trim()).filter((e) => e !== '')],
        logger: { level: flags.logLevel, stream: context.stderr },
        mountRoots: parseMountRoots(flags.mountRoot ?? []),
        ...(flags.defaultTemplate === undefined ? {} : { defaultTemplate: flags.defaultTemplate }),
        superviseSandboxes: flags.supervise !== false,
        ...fairTurnBudget(context.env),
        ...(flags.egressIdleTimeout === undefined ? {} : { egressTimeouts: { idleTimeoutMs: flags.egressIdleTimeout } }),
        ...(flags.logRetention !== undefined && { processLogRetentionMs: flags.logRetention }),
        extensions: [registerMcpHttp],
        ...(flags.publicDomain !== undefined && { publicDomain: flags.publicDomain }),
      });
      context.stdout.write(`URL: ${server.url}\n`);
      const keyLine =
        server.apiKeySource === 'generated'
          ? String(server.generatedApiKey)
          : server.apiKeySource === 'env'
            ? '(from CAPSULE_API_KEY)'
            : '(the one printed at the first start; set CAPSULE_API_KEY to use another)';
      context.stdout.write(`API key: ${keyLine}\n`);
      // A one-time login link (15 minutes); the long-lived key never goes into a URL.
      if (server.consoleUrl) context.stdout.write(`Console: ${server.consoleUrl}\n`);
      if (server.apiKeySource === 'generated') {
        context.stderr.write('capsule: the API key above is shown once (it is stored hashed); keep it, or set CAPSULE_API_KEY\n');
      }
      await new Promise<void>((resolve) => {
        const stop = () => {
          process.off('SIGTERM', stop);
          process.off('SIGINT', stop);
          resolve();
        };
        process.on('SIGTERM', stop);
        process.on('SIGINT', stop);
      });
      const keepSandboxes = flags.supervise !== false && flags.stopSandboxes !== true;
      await server.close({
        keepSandboxes,
        onLeftRunning: (ids) => {
          if (ids.length > 0) context.stderr.write(`capsule: left ${ids.length} sandbox${ids.length === 1 ? '' : 'es'} running (the next start reattaches): ${ids.join(' ')}\n`);
        },
      });
    });
}
