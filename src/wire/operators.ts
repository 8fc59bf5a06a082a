import { z } from 'zod';
import { MOUNT_ROOT_NAME } from '../sandbox-spec/index.js';
import { queryNumber, SANDBOX_ID_PATTERN } from './common.js';

export const TENANT_ID_PATTERN = /^[a-z0-9][a-z0-9_-]{0,63}$/;

export const MintKeyBody = z.strictObject({
  tenantId: z.string().regex(TENANT_ID_PATTERN, 'must be 1-64 lowercase letters, digits, "_" or "-"'),
  name: z.string().max(128).optional(),
  admin: z.boolean().optional(),
  /** The operator's mount roots (`serve --mount-root NAME=PATH`) this key may mount. @default [] */
  mountRoots: z.array(z.string().regex(MOUNT_ROOT_NAME, 'must be the name of a mount root')).max(64).optional(),
  /** The tenant's disk quota for this key's work, overriding the operator's default. */
  diskQuotaBytes: z.number().int().positive().optional(),
});

/** What the operator granted a key beyond its tenant's own sandboxes. */
export const KeyGrantsSchema = z.object({ mountRoots: z.array(z.string()), diskQuotaBytes: z.number().optional() });

export const MintedKeySchema = z.object({
  keyId: z.string(),
  tenantId: z.string(),
  /** null on an idempotent replay: the key is shown once. */
  apiKey: z.string().nullable(),
  name: z.string().nullable(),
  admin: z.boolean(),
  grants: KeyGrantsSchema,
  note: z.string().optional(),
});

const recordNumber = z.string().regex(/^\d{1,15}$/, 'must be a record number').transform(Number);

export const AuditQuery = z.strictObject({
  limit: queryNumber(4, 1, 1000).optional(),
  after: recordNumber.optional(),
  before: recordNumber.optional().meta({ description: 'Only records before this one' }),
  order: z.enum(['asc', 'desc']).optional().meta({ description: 'asc (default): oldest first; desc: newest first' }),
  tenant: z.string().regex(TENANT_ID_PATTERN, 'must be a tenant id').optional(),
  sandboxId: z.string().regex(SANDBOX_ID_PATTERN, 'must be a sandbox id').optional(),
  operation: z.string().regex(/^[A-Za-z0-9._]{1,64}$/, 'must be an operation name').optional().meta({ description: 'e.g. sandboxes.create, sandbox.expired' }),
  outcome: z.string().regex(/^[A-Za-z0-9_:.]{1,64}$/, 'must be an outcome').optional().meta({ description: 'ok, an error code, or limit:<resource>' }),
});

/** The audit records of one sandbox, for its tenant. */
export const SandboxAuditQuery = AuditQuery.pick({ limit: true, after: true, before: true, order: true });

export const AUDIT_PHASES = ['attempt', 'outcome', 'event'] as const;

export const AuditRecordSchema = z.object({
  seq: z.number().int(),
  at: z.string(),
  tenantId: z.string(),
  keyId: z.string().nullable(),
  operation: z.string(),
  phase: z.enum(AUDIT_PHASES),
  attemptSeq: z.number().int().nullable(),
  requestId: z.string().nullable(),
  sandboxId: z.string().nullable(),
  subjectSha256: z.string().nullable(),
  policy: z.string().nullable(),
  outcome: z.string().nullable(),
  prevHash: z.string(),
  hash: z.string(),
});

export const OperationParams = z.strictObject({ key: z.string().min(1).max(200) });

export const OperationSchema = z.object({
  key: z.string(),
  status: z.enum(['in_progress', 'completed']),
  response: z.object({ status: z.number().int(), body: z.unknown() }).optional(),
});

export type AuditRecord = z.output<typeof AuditRecordSchema>;
export type Operation = z.output<typeof OperationSchema>;
