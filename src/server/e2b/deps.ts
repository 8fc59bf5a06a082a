import type { SandboxEngine, SandboxInfo } from '../../engine/types.js';
import type { ApiKeyStore, AuditLog } from '../../store/index.js';
import type { TenantQuota } from '../quota.js';
import type { EnvdTokens } from './access.js';

/** The engine, with pause/resume when it has them (SandboxManager does). */
export interface E2bEngine extends SandboxEngine {
  pause?(tenantId: string, sandboxId: string): Promise<SandboxInfo>;
  resume?(tenantId: string, sandboxId: string): Promise<SandboxInfo>;
}

export interface E2bFacadeDeps {
  engine: E2bEngine;
  keys: ApiKeyStore;
  /** Records create/kill/pause/connect/timeout like the v1 routes do. */
  audit?: AuditLog;
  /** Concurrent sandboxes per tenant, shared with the v1 routes. */
  quota?: TenantQuota;
  /** HMAC key of envd access tokens. @default random per server start */
  tokenSecret?: Buffer;
  /** Aborted when the server closes: ends streams that never end by themselves (watch). */
  closeSignal?: AbortSignal;
}

/** What the facade's resources share. */
export interface E2bContext extends E2bFacadeDeps {
  tokens: EnvdTokens;
}

/** The envd version the facade reports: what it implements, by the SDK's version gates. */
export const ENVD_VERSION = '0.5.7';

/** The route constraint selecting one E2B port (see index.ts). */
// A type alias (not an interface) so it fits Fastify's indexed RouteConstraint.
export type PortConstraint = { e2bPort: string };
