import { isIP } from 'node:net';
import type { FastifyServerOptions } from 'fastify';
import { SandboxError } from '../errors/index.js';
import { createSandboxFiles } from '../engine/files/index.js';
import { SandboxManager } from '../engine/sandbox-manager.js';
import type { EngineEvent } from '../engine/events.js';
import { lockDataDir, type EgressLogEntry, type EgressOptions } from '../engine/engine-host.js';
import { DEFAULT_MAXIMA, type OperatorMaxima } from '../spec/index.js';
import { API_KEY_PATTERN, ApiKeyStore, AuditLog, OperationStore, SqliteSandboxRecords, SqliteSnapshotRecords, SqliteVolumeRecords, openDatabase, type SqliteDatabase } from '../store/index.js';
import { CapsuleApp, type CapsuleAppOptions } from './app.js';
import { Observability } from './observability.js';

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
  /** @default 20 */
  maxSandboxesPerTenant?: number;
  maxima?: OperatorMaxima;
  /** Sandboxes kept started ahead for creates that can use them (see SandboxManagerOptions). @default 0 */
  warmPool?: number;
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
  /** Extra routes (E2B facade, metrics); see CapsuleAppOptions.extensions. */
  extensions?: CapsuleAppOptions['extensions'];
  /**
   * Host directories tenants may mount, by name (`capsule serve --mount-root NAME=PATH`): a spec
   * names a root and a subpath, and only keys granted the root (POST /v1/keys `mountRoots`; the
   * operator's key: all) may use it. Each must be an existing directory apart from the data and
   * database directories and from /proc, /sys, /dev; the start fails otherwise. @default {}
   */
  mountRoots?: Readonly<Record<string, string>>;
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
  app: CapsuleApp;
  db: SqliteDatabase;
  close(): Promise<void>;
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
    const { source, generated } = ensureOperatorKey(new ApiKeyStore(db), options.env ?? process.env);
    new OperationStore(db).settleInterrupted('startup');
    // Metrics, output logs and the artifact store (docs/operations.md).
    const observability = (observed = await Observability.open({ dataDir: options.dataDir, records }));
    // Sandbox networking with the operator's settings; started only when a sandbox asks for a
    // network. The broker reads <dataDir>/broker (handles.json, secrets/); docs/api.md.
    let egressLog = (entry: EgressLogEntry): void => void process.stderr.write(`${JSON.stringify({ egress: entry })}\n`);
    const engine = await SandboxManager.open({
      dataDir: options.dataDir,
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
      store: records,
      snapshotStore: new SqliteSnapshotRecords(db),
      volumeStore: new SqliteVolumeRecords(db),
      maxima: options.maxima,
      warmPool: options.warmPool,
      onEvent: (event) => {
        auditEvent(audit, event);
        observability.onEvent(event);
      },
      processObserver: observability.processObserver,
      artifacts: observability.artifacts,
      filesFactory: (sandbox) => createSandboxFiles(sandbox),
      mountRoots,
    });
    const app = new CapsuleApp({ engine, db, maxSandboxesPerTenant: options.maxSandboxesPerTenant, logger: options.logger, extensions: options.extensions, observability: observability.services });
    // Repeats come summed (`repeated`, once per window); metrics still count every denial.
    egressLog = (entry) => app.app.log.warn({ egress: entry }, entry.repeated === undefined ? 'egress denied' : 'egress denied (repeats)');
    let url: string;
    try {
      url = await app.listen(options.port ?? 7070, options.host ?? '127.0.0.1');
    } catch (error) {
      await app.close();
      throw error;
    }
    app.app.log.info({ auditHead: audit.head() }, 'capsule server listening');
    let closing: Promise<void> | undefined;
    return {
      url,
      generatedApiKey: generated,
      apiKeySource: source,
      app,
      db,
      close: () =>
        (closing ??= (async () => {
          try {
            await app.close();
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
      outcome: event.sandbox.endReason ?? event.sandbox.state,
    });
  } catch (error) {
    // The engine's own work cannot be undone; the failure is reported on stderr for the operator.
    process.stderr.write(`capsule: audit log write failed for ${event.type} of ${event.sandbox.sandboxId}: ${(error as Error).message}\n`);
  }
}
