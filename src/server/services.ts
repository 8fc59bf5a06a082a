import type { SandboxEngine } from '../engine/types.js';
import type { SandboxInfo } from '../wire/index.js';
import type { CapsuleMetrics } from '../metrics/metrics.js';
import type { ArtifactStore } from '../store/artifacts/index.js';
import type { ProcessLogs } from '../engine/process-logs.js';
import { SandboxError } from '../errors/index.js';
import type { ApiKeyStore, AuditLog, OperationStore, SqliteSandboxRecords } from '../store/index.js';
import type { TenantDiskQuota } from './disk-quota.js';
import type { TemplateService } from '../templates/index.js';
import type { ConsoleSessions } from './console/sessions.js';
import type { EnvdTokens } from './e2b/access.js';
import type { PortUrlSigner } from './ports/port-access.js';
import type { PortConnectionPool } from './ports/port-pool.js';
import type { SeamCalls } from './in-process.js';

/** What the routes are built on: one object, passed in (no module state). */
export interface ServerServices {
  engine: SandboxEngine;
  records: SqliteSandboxRecords;
  keys: ApiKeyStore;
  operations: OperationStore;
  audit: AuditLog;
  closeSignal: AbortSignal;
  /** Resumes a paused sandbox created with `autoResume` before a call acts inside it (routes with `wakes`). */
  wake(tenantId: string, sandboxId: string): Promise<void>;
  /** Runs `fn` in one SQLite transaction (nested calls join it): the writes of a call commit together. */
  atomically<T>(fn: () => T): T;
  /** The `/v1` routes for calls made in this process (MCP's tools, through the SDK): in-process.ts. */
  calls: SeamCalls;
  /** Sandbox access tokens (E2B's envd and traffic tokens); the port proxy accepts them too. */
  accessTokens: EnvdTokens;
  /** Signs and checks port URLs (`capsule sandbox url`). */
  portUrls: PortUrlSigner;
  /** Keep-alive connections to sandbox ports, reused between proxied requests. */
  portPool: PortConnectionPool;
  /** With `--public-domain D`, port P of sandbox ID is also `http://P-ID.D/` (routing by Host). */
  publicDomain?: string;
  /** Prometheus metrics (GET /metrics); record at the seams, e.g. `metrics.recordEgressBlocked()`. */
  metrics?: CapsuleMetrics;
  /** Where collected artifacts go (/v1/artifacts). */
  artifacts?: ArtifactStore;
  /** Full output of processes (GET /v1/sandboxes/{id}/processes/{pid}/log). */
  processLogs?: ProcessLogs;
  /** Each tenant's disk quota (workspaces, logs, artifacts, snapshots). */
  diskQuota?: TenantDiskQuota;
  /** Templates (/v1/templates): the store and builds, and where inline build contexts are written. */
  templates?: { service: TemplateService; contextDir: string; e2bFilesDir?: string };
  /** The web console's session keys and login tokens (POST /v1/sessions). */
  sessions?: ConsoleSessions;
}

/** The tenant's record of a sandbox; a foreign or unknown id is SANDBOX_NOT_FOUND (never 403). */
export function requireSandbox(services: ServerServices, tenantId: string, sandboxId: string): SandboxInfo {
  const record = services.records.get(tenantId, sandboxId);
  if (!record) {
    throw new SandboxError('SANDBOX_NOT_FOUND', `sandbox ${sandboxId} not found`, {
      details: { sandboxId },
      hint: 'Check the id (GET /v1/sandboxes lists yours); sandboxes of other tenants are not visible.',
    });
  }
  return record;
}
