import { z } from 'zod';
import { SANDBOX_ID_PATTERN } from '../engine/ids.js';
import { LIMIT_RESOURCES } from '../engine/result.js';
import { ERROR_CODES } from '../errors/index.js';
import { SandboxSpecSchema } from '../spec/index.js';

/**
 * The wire schemas of the v1 API (docs/api.md). Routes validate requests with them and
 * `/openapi.json` is generated from them, so the two cannot drift apart.
 */

const MAX_PATH_LENGTH = 4096;
const SANDBOX_STATES = ['starting', 'running', 'paused', 'killed', 'expired', 'failed'] as const;

const noNul = z.string().refine((s) => !s.includes('\0'), 'must not contain NUL bytes');

/** Keys may not hold "=" (the list filter is `metadata=k=v`). */
export const MetadataSchema = z
  .record(z.string().min(1).max(128).regex(/^[^=\0]+$/, 'must not contain "=" or NUL'), z.string().max(1024).refine((s) => !s.includes('\0'), 'must not contain NUL bytes'))
  .refine((m) => Object.keys(m).length <= 64, 'at most 64 metadata pairs');

export const SandboxIdParams = z.strictObject({ sandboxId: z.string().regex(SANDBOX_ID_PATTERN) });
export const ProcessParams = z.strictObject({
  sandboxId: z.string().regex(SANDBOX_ID_PATTERN),
  pid: z.string().regex(/^[1-9][0-9]{0,9}$/, 'must be a process id').transform(Number),
});
export const OperationParams = z.strictObject({ key: z.string().min(1).max(200) });

// ---- Sandboxes

export const CreateSandboxBody = z.strictObject({
  spec: z.unknown().optional().meta({ description: 'A SandboxSpecInput; validated by the engine (unknown keys are errors).' }),
  metadata: MetadataSchema.optional(),
});

const oneOrMany = z.union([z.string(), z.array(z.string())]).transform((v) => (Array.isArray(v) ? v : [v]));

export const ListSandboxesQuery = z.strictObject({
  /** Comma-separated or repeated. */
  state: oneOrMany
    .transform((v) => v.flatMap((s) => s.split(',')).filter((s) => s !== ''))
    .pipe(z.array(z.enum(SANDBOX_STATES)))
    .optional()
    .meta({ description: `States to include, comma-separated or repeated: ${SANDBOX_STATES.join(', ')}` }),
  /** `k=v`, repeated; all pairs must match. */
  metadata: oneOrMany
    .pipe(z.array(z.string().regex(/^[^=]+=/, 'must be key=value')))
    .transform((pairs) => Object.fromEntries(pairs.map((p) => [p.slice(0, p.indexOf('=')), p.slice(p.indexOf('=') + 1)])))
    .optional()
    .meta({ description: 'key=value, repeated; a sandbox matches when every pair matches exactly' }),
  limit: z.string().regex(/^\d{1,4}$/, 'must be a number').transform(Number).pipe(z.number().int().min(1).max(1000)).optional(),
  cursor: z.string().min(1).max(1024).optional().meta({ description: 'nextCursor of the previous page' }),
});

export const SetTimeoutBody = z.strictObject({ ttlMs: z.number().int().positive() });

export const SandboxInfoSchema = z.object({
  sandboxId: z.string(),
  tenantId: z.string(),
  state: z.enum(SANDBOX_STATES),
  backend: z.string(),
  spec: SandboxSpecSchema,
  metadata: z.record(z.string(), z.string()),
  createdAt: z.string(),
  expiresAt: z.string(),
  endedAt: z.string().optional(),
  endReason: z.string().optional(),
  pause: z.object({ keepsMemory: z.boolean(), survivesRestart: z.boolean(), pausedAt: z.string() }).optional(),
});

export const SandboxPageSchema = z.object({ sandboxes: z.array(SandboxInfoSchema), nextCursor: z.string().nullable() });

// ---- Processes

const envName = z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'must be a valid environment variable name');

export const StartProcessBody = z.strictObject({
  argv: z.array(noNul).min(1).max(4096),
  cwd: noNul.pipe(z.string().min(1).max(MAX_PATH_LENGTH)).optional(),
  env: z.record(envName, noNul).optional(),
  timeoutMs: z.number().int().positive().optional(),
  stdin: z.boolean().optional(),
  background: z.boolean().optional(),
  tag: z.string().max(256).optional(),
  pty: z.strictObject({ cols: z.number().int().min(1).max(1000), rows: z.number().int().min(1).max(1000) }).optional(),
  /** After the exit, collect this directory: the foreground exit result carries `artifacts`. */
  collectArtifacts: z.strictObject({ dir: z.string().min(1).max(MAX_PATH_LENGTH).optional() }).optional(),
});

export const SIGNALS = ['SIGTERM', 'SIGKILL', 'SIGINT', 'SIGHUP', 'SIGQUIT', 'SIGUSR1', 'SIGUSR2', 'SIGSTOP', 'SIGCONT', 'SIGWINCH'] as const;
export const SignalBody = z.strictObject({ signal: z.enum(SIGNALS) });

export const ProcessInfoSchema = z.object({
  pid: z.number().int(),
  argv: z.array(z.string()),
  cwd: z.string(),
  tag: z.string().optional(),
  running: z.boolean(),
  startedAt: z.string(),
});

const LimitHitSchema = z.object({
  resource: z.enum(LIMIT_RESOURCES),
  limit: z.number(),
  used: z.number().nullable(),
  unit: z.enum(['bytes', 'ms', 'count']),
  message: z.string(),
});
const WarningSchema = z.object({ resource: z.literal('memory'), limit: z.number(), used: z.number(), message: z.string() });

export const ExecResultSchema = z.object({
  outcome: z.enum(['ok', 'exit_nonzero', 'limit_exceeded', 'error']),
  exitCode: z.number().int().nullable(),
  signal: z.string().nullable(),
  stdout: z.string(),
  stderr: z.string(),
  stdoutTruncated: z.boolean(),
  stderrTruncated: z.boolean(),
  /** Set when `stdout` holds only the first 1 MiB of the kept stdout; the events and the log hold it all. */
  stdoutInlineTruncated: z.boolean().optional(),
  stderrInlineTruncated: z.boolean().optional(),
  stdoutBytes: z.number(),
  stderrBytes: z.number(),
  durationMs: z.number(),
  usage: z.object({ memoryPeakBytes: z.number(), cpuTimeMs: z.number(), cpuThrottledMs: z.number(), diskUsedBytes: z.number().nullable() }),
  limit: LimitHitSchema.optional(),
  warnings: z.array(WarningSchema),
  error: z.object({ code: z.string(), message: z.string() }).optional(),
  /** With `collectArtifacts`: the references collected after the exit (see POST .../artifacts). */
  artifacts: z.array(z.record(z.string(), z.unknown())).optional(),
  artifactsTruncated: z.boolean().optional(),
  /** With `collectArtifacts`: why the collection failed (the exec's own outcome stands). */
  artifactsError: z.object({ code: z.string(), message: z.string() }).optional(),
});

/** One NDJSON line of a process stream; stdout/stderr data is base64. */
export const ProcessEventSchema = z.discriminatedUnion('type', [
  z.object({ type: z.literal('start'), pid: z.number().int() }),
  z.object({ type: z.literal('stdout'), data: z.string().meta({ description: 'base64' }) }),
  z.object({ type: z.literal('stderr'), data: z.string().meta({ description: 'base64' }) }),
  z.object({ type: z.literal('warning'), warning: WarningSchema }),
  z.object({ type: z.literal('exit'), result: ExecResultSchema }),
  z.object({ type: z.literal('error'), error: z.object({ code: z.string(), message: z.string(), requestId: z.string() }) }),
]);

// ---- Files

/** A path as the sandbox sees it; the file service resolves it (relative → under /workspace). */
export const SandboxPath = z.string().min(1).max(MAX_PATH_LENGTH).refine((s) => !s.includes('\0'), 'must not contain NUL bytes');

export const PathQuery = z.strictObject({ path: SandboxPath });
export const ListFilesQuery = z.strictObject({
  path: SandboxPath,
  depth: z.string().regex(/^\d{1,2}$/, 'must be a number').transform(Number).pipe(z.number().int().min(1).max(32)).optional(),
});
export const WatchQuery = z.strictObject({ path: SandboxPath, recursive: z.enum(['true', 'false']).transform((v) => v === 'true').optional() });
export const MkdirBody = z.strictObject({ path: SandboxPath });
export const MoveBody = z.strictObject({ source: SandboxPath, destination: SandboxPath });

export const FileEntrySchema = z.object({
  name: z.string(),
  path: z.string(),
  type: z.enum(['file', 'dir', 'symlink', 'other']),
  size: z.number(),
  mode: z.number(),
  modifiedAt: z.string(),
  symlinkTarget: z.string().optional(),
});
export const WatchEventSchema = z.object({ type: z.enum(['create', 'write', 'remove', 'rename', 'chmod']), path: z.string() });

// ---- Operators

export const MintKeyBody = z.strictObject({
  tenantId: z.string().regex(/^[a-z0-9][a-z0-9_-]{0,63}$/, 'must be 1-64 lowercase letters, digits, "_" or "-"'),
  name: z.string().max(128).optional(),
  admin: z.boolean().optional(),
});
export const MintedKeySchema = z.object({
  keyId: z.string(),
  tenantId: z.string(),
  /** null on an idempotent replay: the key is shown once. */
  apiKey: z.string().nullable(),
  name: z.string().nullable(),
  admin: z.boolean(),
  note: z.string().optional(),
});

export const AuditQuery = z.strictObject({
  limit: z.string().regex(/^\d{1,4}$/, 'must be a number').transform(Number).pipe(z.number().int().min(1).max(1000)).optional(),
  after: z.string().regex(/^\d{1,15}$/, 'must be a record number').transform(Number).optional(),
});

export const AuditRecordSchema = z.object({
  seq: z.number().int(),
  at: z.string(),
  tenantId: z.string(),
  keyId: z.string().nullable(),
  operation: z.string(),
  phase: z.enum(['attempt', 'outcome', 'event']),
  attemptSeq: z.number().int().nullable(),
  requestId: z.string().nullable(),
  sandboxId: z.string().nullable(),
  subjectSha256: z.string().nullable(),
  policy: z.string().nullable(),
  outcome: z.string().nullable(),
  prevHash: z.string(),
  hash: z.string(),
});

export const OperationSchema = z.object({
  key: z.string(),
  status: z.enum(['in_progress', 'completed']),
  response: z.object({ status: z.number().int(), body: z.unknown() }).optional(),
});

export const ErrorBodySchema = z.object({
  code: z.enum(ERROR_CODES),
  message: z.string(),
  details: z.record(z.string(), z.unknown()).optional(),
  hint: z.string().optional(),
  requestId: z.string(),
});
