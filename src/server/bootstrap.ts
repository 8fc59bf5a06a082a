import { isIP } from 'node:net';
import { join } from 'node:path';
import type { FastifyServerOptions } from 'fastify';
import { SandboxError } from '../errors/index.js';
import { createSandboxFiles } from '../engine/files/index.js';
import { SandboxManager } from '../engine/sandbox-manager.js';
import type { EngineEvent } from '../engine/events.js';
import type { AdmissionSettings } from '../engine/admission-settings.js';
import { loadTokenKey, lockDataDir, type EgressLogEntry, type EgressOptions } from '../engine/engine-host.js';
import { DEFAULT_MAXIMA, type OperatorMaxima } from '../sandbox-spec/index.js';
import { API_KEY_PATTERN, ApiKeyStore, AuditLog, OperationStore, SqliteSandboxRecords, SqliteSnapshotRecords, SqliteVolumeRecords, openDatabase, type SqliteDatabase } from '../store/index.js';
import { CapsuleApp, type CapsuleAppOptions } from './app.js';
import { TenantDiskQuota } from './disk-quota.js';
import { Observability } from './observability.js';
import { openTemplateHost, StoredTemplates } from '../engine/stored-templates.js';
import type { StepRunner } from '../templates/index.js';
import { ConsoleSessions } from './console/sessions.js';
import { SandboxFeed } from './console/sandbox-feed.js';

export interface StartServerOptions {
  /** Capsule's data directory (workspaces, cgroup names, the state database). */
  dataDir: string;
  /** Where capsule.db lives. @default dataDir */
  databaseDir?: string;
  /** @default 7070 */
  port?: number;
  /** @default '127.0.0.1' */
  host?: string;
  /** Reads CAPSULE_API_KEY. @default process.env */
  env?: NodeJS.ProcessEnv;
  /** Live sandboxes per tenant, counting those still starting (`capsule serve --max-sandboxes`; QUOTA_EXCEEDED). @default 20 */
  maxSandboxesPerTenant?: number;
  /**
   * Admission control beside the tenant quota (`capsule serve --max-live-sandboxes`,
   * `--memory-overcommit`, `--memory-reserve`, `--pids-overcommit`, `--max-capacity-wait`;
   * docs/operations.md). @default AdmissionSettings' defaults
   */
  admission?: Omit<AdmissionSettings, 'maxSandboxesPerTenant'>;
  /** Port URLs by host, `http://P-ID.D/` (`capsule serve --public-domain D`). @default none */
  publicDomain?: string;
  maxima?: OperatorMaxima;
  /** Sandboxes kept started ahead for creates that can use them (see SandboxManagerOptions). @default 0 */
  warmPool?: number;
  /**
   * Each tenant's disk quota over its workspaces (by their disk limits), process logs, artifacts
   * and snapshots, unless its key carries its own (`capsule serve --tenant-disk-quota`). @default 20 GiB
   */
  tenantDiskQuotaBytes?: number;
  /**
   * How far the disk limits of live sandboxes may exceed what the workspace volume can back
   * (`capsule serve --disk-overcommit`): 1 refuses a create that does not fit (CAPACITY_EXHAUSTED). @default 1
   */
  diskOvercommit?: number;
  /** Template builds one tenant may run at once (`capsule serve --max-builds-per-tenant`). @default 2 */
  maxBuildsPerTenant?: number;
  /** Size of the workspace volume's image when it is first made (`capsule serve --volume-size`). @default 32 GiB */
  volumeBytes?: number;
  /**
   * Turn on the cgroup2 option `favordynmods` so that a sandbox start's cgroup migration takes
   * microseconds, not an RCU grace period (`capsule serve --no-cgroup-favordynmods` leaves it). @default true
   */
  favorCgroupMigrations?: boolean;
  /** @default false */
  logger?: FastifyServerOptions['logger'];
  /**
   * Operator deny list (`capsule serve --deny`): domains (with their subdomains) and CIDRs no
   * sandbox may reach, whatever its allow list says. @default []
   */
  operatorDeny?: readonly string[];
  /**
   * Tests only: the egress proxy resolves names from this map and nothing else (no query leaves
   * the machine). Not a CLI flag. @default the system resolver
   */
  egressHosts?: Readonly<Record<string, readonly string[]>>;
  /**
   * Egress proxy timeouts (`capsule serve --egress-idle-timeout`): a connection that names no
   * destination within `handshakeTimeoutMs`, or is idle for `idleTimeoutMs`, is closed.
   * @default DEFAULT_EGRESS_TIMEOUTS (10 s, 5 min)
   */
  egressTimeouts?: EgressOptions['timeouts'];
  /**
   * Descriptors kept for the API and the rest of the server: the egress proxy holds at most
   * RLIMIT_NOFILE minus this for all sandboxes. @default a quarter of the limit, at least 1024
   */
  egressDescriptorReserve?: number;
  /**
   * How long an ended sandbox's process output logs (and its processes' records beside them) are
   * kept (`capsule serve --log-retention`). @default 1 hour
   */
  processLogRetentionMs?: number;
  /** Extra routes (E2B facade, metrics); see CapsuleAppOptions.extensions. */
  extensions?: CapsuleAppOptions['extensions'];
  /**
   * Host directories tenants may mount, by name (`capsule serve --mount-root NAME=PATH`): a spec
   * names a root and a subpath, and only keys granted the root (POST /v1/keys `mountRoots`; the
   * operator's key: all) may use it. Each must be an existing directory apart from the data and
   * database directories and from /proc, /sys, /dev; the start fails otherwise. @default {}
   */
  mountRoots?: Readonly<Record<string, string>>;
  /**
   * The template of specs that name none (`capsule serve --default-template`): a public template
   * in the store, or `host` (the host's /usr, read-only). @default 'host'
   */
  defaultTemplate?: string;
  /** Where the built web console is. @default dist/console under the package root */
  uiDir?: string;
  /**
   * Sandboxes (both backends) outlive the server: each is held by a supervisor daemon, and the
   * next start reattaches to it with its processes, contexts, network policy and the output they
   * wrote meanwhile; `close({ keepSandboxes: true })` leaves them running. `capsule serve` turns
   * it on unless `--no-supervise`. @default false (an embedding process that did not ask)
   */
  superviseSandboxes?: boolean;
  /** See CapsuleAppOptions.fairTurnBudgetMs (`CAPSULE_FAIR_TURN_BUDGET_MS`, a diagnostic). @default 2 */
  fairTurnBudgetMs?: number;
}

export interface RunningServer {
  url: string;
  /**
   * The operator key, when this start made it (CAPSULE_API_KEY unset, no key yet). Otherwise
   * undefined: it is stored hashed only.
   */
  generatedApiKey: string | undefined;
  /** `from CAPSULE_API_KEY`, `generated`, or `existing`. */
  apiKeySource: 'env' | 'generated' | 'existing';
  /**
   * The web console on loopback with a one-time login token (15 minutes) in its fragment, which
   * signs the operator in once; undefined when no operator key exists.
   */
  consoleUrl: string | undefined;
  /** Another such URL, with a fresh token. */
  newConsoleUrl(): string | undefined;
  app: CapsuleApp;
  db: SqliteDatabase;
  /** With `keepSandboxes`, supervised sandboxes keep running (see SandboxEngine.close). */
  close(options?: { keepSandboxes?: boolean; onLeftRunning?: (sandboxIds: string[]) => void }): Promise<void>;
}

/**
 * Opens the state database, reconciles the host with it (the engine recovers or fails the
 * sandboxes a crash left), makes sure an operator key exists, and listens.
 */
export async function startServer(options: StartServerOptions): Promise<RunningServer> {
  checkDenyEntries(options.operatorDeny ?? []);
  const mountRoots = await SandboxManager.checkMountRoots(options.mountRoots ?? {}, [options.dataDir, options.databaseDir ?? options.dataDir]);
  const lock = lockDataDir(options.dataDir);
  let db: SqliteDatabase | undefined;
  let observed: Observability | undefined;
  try {
    db = openDatabase(options.databaseDir ?? options.dataDir);
    const records = new SqliteSandboxRecords(db);
    const audit = new AuditLog(db);
    const keys = new ApiKeyStore(db);
    const { source, generated } = ensureOperatorKey(keys, options.env ?? process.env);
    // The console's sessions live in memory; its feed sees every record the engine writes.
    const sessions = new ConsoleSessions();
    const feed = new SandboxFeed();
    new OperationStore(db).settleInterrupted('startup');
    // Metrics, output logs and the artifact store (docs/operations.md); logs, artifacts,
    // workspaces, snapshots, volumes and template layers are charged to each tenant's disk quota.
    const diskQuota = new TenantDiskQuota({ defaultBytes: options.tenantDiskQuotaBytes });
    const observability = (observed = await Observability.open({ dataDir: options.dataDir, records, diskQuota, processLogRetentionMs: options.processLogRetentionMs }));
    // Sandbox networking with the operator's settings; started only when a sandbox asks for a
    // network. The broker reads <dataDir>/broker (handles.json, secrets/); docs/api.md.
    let egressLog = (entry: EgressLogEntry): void => void process.stderr.write(`${JSON.stringify({ egress: entry })}\n`);
    // Templates live on the engine's host (its volume); RUN steps run on the engine's backends.
    const steps: { runner?: StepRunner } = {};
    const { host, service: templates } = openTemplateHost({
      dataDir: options.dataDir,
      volumeBytes: options.volumeBytes,
      favorCgroupMigrations: options.favorCgroupMigrations,
      stepRunner: { run: (step, runOptions) => (steps.runner ?? unstarted()).run(step, runOptions) },
      // A tenant's builds are charged to its disk quota and bounded in number.
      budget: diskQuota,
      ...(options.maxBuildsPerTenant !== undefined ? { maxConcurrentBuildsPerTenant: options.maxBuildsPerTenant } : {}),
    });
    const engine = await SandboxManager.open({
      dataDir: options.dataDir,
      host,
      templates: new StoredTemplates(templates, options.defaultTemplate),
      supervise: options.superviseSandboxes === true,
      egress: {
        operatorDeny: options.operatorDeny,
        hosts: options.egressHosts,
        log: (entry) => egressLog(entry),
        timeouts: options.egressTimeouts,
        descriptorReserve: options.egressDescriptorReserve,
        maxConcurrentConnections: (options.maxima ?? DEFAULT_MAXIMA).network?.maxConcurrentConnections,
        // egress_blocked_total; a connection-limit hit ends the work and is counted with its exec.
        onEvent: (event) => {
          if (event.kind === 'blocked') observability.metrics.recordEgressBlocked();
        },
      },
      store: feed.observe(records),
      snapshotStore: new SqliteSnapshotRecords(db),
      volumeStore: new SqliteVolumeRecords(db),
      maxima: options.maxima,
      warmPool: options.warmPool,
      onEvent: (event) => {
        // A sandbox the host failed to take over (its files kept, its processes gone): the operator hears why.
        if (event.type === 'sandbox.recovered' && event.reason !== undefined) {
          process.stderr.write(`capsule: sandbox ${event.sandbox.sandboxId} ${event.reason}; recovered on its files (its processes are gone)\n`);
        }
        auditEvent(audit, event);
        observability.onEvent(event);
      },
      processObserver: observability.processObserver,
      artifacts: observability.artifacts,
      processLogs: observability.processLogs,
      workspaceBudget: diskQuota,
      diskOvercommit: options.diskOvercommit,
      admission: { ...options.admission, maxSandboxesPerTenant: options.maxSandboxesPerTenant ?? 20 },
      volumeBytes: options.volumeBytes,
      filesFactory: (sandbox) => createSandboxFiles(sandbox),
      mountRoots,
    });
    steps.runner = engine.buildStepRunner();
    // Builds a crash cut short leave pending layers and temps: gone before anything new starts.
    await templates.reconcile();
    // Template layers count against their tenants' quotas from the start, as snapshots and volumes do.
    await templates.refreshBudget();
    const app = new CapsuleApp({
      engine,
      db,
      // Access tokens and signed URLs outlive a restart, like the sandboxes they open.
      tokenKey: loadTokenKey(options.dataDir),
      ...(options.fairTurnBudgetMs !== undefined ? { fairTurnBudgetMs: options.fairTurnBudgetMs } : {}),
      logger: options.logger,
      extensions: options.extensions,
      observability: observability.services,
      templates: { service: templates, contextDir: join(options.dataDir, 'build-contexts'), e2bFilesDir: join(options.dataDir, 'e2b-template-files') },
      ...(options.publicDomain !== undefined ? { publicDomain: options.publicDomain } : {}),
      console: { sessions, feed, dataDir: options.dataDir, ...(options.uiDir !== undefined ? { uiDir: options.uiDir } : {}) },
    });
    // Repeats come summed (`repeated`, once per window); metrics still count every denial.
    egressLog = (entry) => app.app.log.warn({ egress: entry }, entry.repeated === undefined ? 'egress denied' : 'egress denied (repeats)');
    let url: string;
    try {
      url = await app.listen(options.port ?? 7070, options.host ?? '127.0.0.1');
    } catch (error) {
      await app.close();
      throw error;
    }
    // How disk limits count on this volume (decision 022): simple on volumes made on a 6.7+ kernel;
    // how a sandbox start joins its cgroups (favordynmods, or the kernel's default and why).
    const migrations = host.cgroupMigrations();
    app.app.log.info(
      {
        auditHead: audit.head(),
        quotaAccounting: await host.volume.accounting().catch(() => 'unknown'),
        cgroupMigrations: migrations === undefined ? 'unknown' : migrations.mode === 'favordynmods' ? `favordynmods${migrations.changed ? ' (turned on)' : ''}` : `default: ${migrations.reason}`,
      },
      'capsule server listening',
    );
    let closing: Promise<void> | undefined;
    const newConsoleUrl = (): string | undefined => {
      const operator = keys.operatorKey();
      return operator ? `${loopbackUrl(url)}/ui/#login=${sessions.mintLoginToken(operator).token}` : undefined;
    };
    return {
      url,
      generatedApiKey: generated,
      apiKeySource: source,
      consoleUrl: newConsoleUrl(),
      newConsoleUrl,
      app,
      db,
      close: (closeOptions = {}) =>
        (closing ??= (async () => {
          try {
            await app.close({
              keepSandboxes: closeOptions.keepSandboxes,
              onLeftRunning: (ids) => {
                if (ids.length > 0) app.app.log.warn({ sandboxIds: ids }, `left ${ids.length} sandboxes running under their supervisors`);
                closeOptions.onLeftRunning?.(ids);
              },
            });
            await observability.close();
            app.app.log.info({ auditHead: audit.head() }, 'capsule server stopped');
          } finally {
            db?.close();
            lock.release();
          }
        })()),
    };
  } catch (error) {
    await observed?.close().catch(() => undefined);
    if (db?.open) db.close();
    lock.release();
    throw error;
  }
}

/** The server's URL as reached from this machine: a wildcard address becomes loopback. */
function loopbackUrl(url: string): string {
  return url.replace(/^http:\/\/(0\.0\.0\.0|\[::\])(?=:)/, (_m, host: string) => (host === '0.0.0.0' ? 'http://127.0.0.1' : 'http://[::1]'));
}

/** A deny entry that matches nothing would weaken the operator's intent silently: refuse it. */
function checkDenyEntries(entries: readonly string[]): void {
  for (const entry of entries) {
    const text = entry.trim().toLowerCase();
    const [address = '', prefix, extra] = text.split('/');
    const family = isIP(address);
    const isCidr = prefix !== undefined && extra === undefined && family !== 0 && /^\d{1,3}$/.test(prefix) && Number(prefix) <= (family === 4 ? 32 : 128);
    const isDomain = prefix === undefined && /^(\*\.)?[a-z0-9-]+(\.[a-z0-9-]+)*(:\d{1,5})?$/.test(text);
    if (!isCidr && !isDomain) {
      throw new SandboxError('INVALID_ARGUMENT', `operator deny entry "${entry}" is neither a domain nor a CIDR`, {
        details: { field: 'operatorDeny', value: entry },
        hint: 'Write a domain (example.com, which covers its subdomains) or a CIDR (203.0.113.0/24) per --deny.',
      });
    }
  }
}

function ensureOperatorKey(keys: ApiKeyStore, env: NodeJS.ProcessEnv): { source: RunningServer['apiKeySource']; generated?: string } {
  const fromEnv = env.CAPSULE_API_KEY;
  if (fromEnv !== undefined && fromEnv !== '') {
    if (!API_KEY_PATTERN.test(fromEnv)) {
      throw new SandboxError('INVALID_ARGUMENT', 'CAPSULE_API_KEY is not a Capsule API key', {
        details: { field: 'CAPSULE_API_KEY' },
        hint: 'Use cap_ followed by 40 lowercase hex digits, e.g. cap_$(openssl rand -hex 20), or unset it to have one generated.',
      });
    }
    keys.ensureAdminKey(fromEnv, 'CAPSULE_API_KEY');
    return { source: 'env' };
  }
  if (keys.hasAdminKey()) return { source: 'existing' };
  return { source: 'generated', generated: keys.mint('default', { name: 'generated at first start', isAdmin: true }).apiKey };
}

/** What the engine did on its own (TTL expiry, crash, recovery, shutdown kill) goes in the audit log. */
function auditEvent(audit: AuditLog, event: EngineEvent): void {
  if (event.type === 'sandbox.created') return; // recorded by the create call itself
  try {
    audit.append({
      tenantId: event.sandbox.tenantId,
      keyId: null,
      operation: event.type,
      phase: 'event',
      sandboxId: event.sandbox.sandboxId,
      outcome: event.sandbox.endReason ?? (event.reason !== undefined ? `${event.sandbox.state}: ${event.reason}` : event.sandbox.state),
    });
  } catch (error) {
    // The engine's own work cannot be undone; the failure is reported on stderr for the operator.
    process.stderr.write(`capsule: audit log write failed for ${event.type} of ${event.sandbox.sandboxId}: ${(error as Error).message}\n`);
  }
}

function unstarted(): never {
  throw new SandboxError('HOST_NOT_READY', 'the server is still starting: build steps run once the engine is open', {
    hint: 'Retry the build in a moment.',
  });
}
