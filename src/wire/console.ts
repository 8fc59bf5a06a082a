import { z } from 'zod';
import { ListSandboxesQuery, SandboxInfoSchema } from './sandbox.js';
import { UsageSampleSchema } from './usage.js';
import { TENANT_ID_PATTERN } from './operators.js';

/**
 * The calls the web console needs beyond the sandbox API, open to every client alike: sessions,
 * who a key is, the operator's cross-tenant views, a feed of changes, metrics history and
 * audit verification.
 */

export const LoginBody = z.strictObject({
  loginToken: z.string().min(1).max(64).meta({ description: 'The one-time token in the console URL `capsule serve` printed' }),
});

export const SessionSchema = z.object({
  /** A short-lived key acting as the key it was made from; send it as a Bearer key. */
  sessionKey: z.string(),
  expiresAt: z.string(),
  tenantId: z.string(),
  keyId: z.string(),
  admin: z.boolean(),
});

export const WhoAmISchema = z.object({
  tenantId: z.string(),
  keyId: z.string(),
  admin: z.boolean(),
  /** Set when the key is a console session: when it ends. */
  sessionExpiresAt: z.string().nullable(),
});

export const AdminSandboxesQuery = ListSandboxesQuery.extend({
  tenant: z.string().regex(TENANT_ID_PATTERN, 'must be a tenant id').optional().meta({ description: 'Only this tenant; every tenant when left out' }),
});

export const AdminFeedQuery = z.strictObject({
  tenant: z.string().regex(TENANT_ID_PATTERN, 'must be a tenant id').optional().meta({ description: 'Only this tenant; every tenant when left out' }),
});

export const FeedEventSchema = z.discriminatedUnion('type', [
  z.object({ type: z.literal('snapshot'), sandboxes: z.array(SandboxInfoSchema) }),
  z.object({ type: z.literal('sandbox'), sandbox: SandboxInfoSchema }),
  z.object({ type: z.literal('usage'), sandboxId: z.string(), tenantId: z.string(), sample: UsageSampleSchema }),
  z.object({ type: z.literal('keepalive') }),
]);

/** Create-duration percentiles of one label set over the window before a sample. */
export const CreatePercentilesSchema = z.object({
  backend: z.string(),
  template: z.string(),
  poolWarm: z.boolean(),
  /** Creates in the window. */
  count: z.number(),
  /** Seconds; null when the window had no create. */
  p50: z.number().nullable(),
  p95: z.number().nullable(),
  p99: z.number().nullable(),
});

export const MetricsSampleSchema = z.object({
  timestamp: z.string(),
  /** Over the `windowMs` before the sample. */
  creates: z.array(CreatePercentilesSchema),
  /** Counters since the server started; a client charts their rate between samples. */
  limitTerminations: z.record(z.string(), z.number()),
  egressBlocked: z.number(),
  artifactDeliveries: z.record(z.string(), z.number()),
  execs: z.record(z.string(), z.number()),
  activeSandboxes: z.number(),
});

export const CapacitySchema = z.object({
  cpus: z.number(),
  memoryBytes: z.number(),
  memoryAvailableBytes: z.number(),
  load1: z.number(),
  sandboxes: z.object({ live: z.number(), running: z.number(), paused: z.number() }),
  /** What the live sandboxes' limits add up to. */
  reserved: z.object({ cpus: z.number(), memoryBytes: z.number(), diskBytes: z.number() }),
  /** The data directory's filesystem (workspaces live there); null when it cannot be read. */
  disk: z.object({ totalBytes: z.number(), freeBytes: z.number() }).nullable(),
});

export const MetricsHistorySchema = z.object({
  intervalMs: z.number(),
  windowMs: z.number(),
  samples: z.array(MetricsSampleSchema),
  capacity: CapacitySchema,
});

export const AuditVerifySchema = z.discriminatedUnion('ok', [
  z.object({ ok: z.literal(true), records: z.number(), headHash: z.string() }),
  z.object({ ok: z.literal(false), records: z.number(), badSeq: z.number(), reason: z.string() }),
]);

export type FeedEventWire = z.output<typeof FeedEventSchema>;
export type MetricsSample = z.output<typeof MetricsSampleSchema>;
export type CreatePercentiles = z.output<typeof CreatePercentilesSchema>;
export type Capacity = z.output<typeof CapacitySchema>;
export type MetricsHistory = z.output<typeof MetricsHistorySchema>;
export type Session = z.output<typeof SessionSchema>;
export type WhoAmI = z.output<typeof WhoAmISchema>;
