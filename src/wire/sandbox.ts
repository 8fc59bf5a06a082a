import { z } from 'zod';
import { SandboxSpecSchema } from '../sandbox-spec/index.js';
import { queryNumber, SANDBOX_ID_PATTERN } from './common.js';

export const SANDBOX_STATES = ['starting', 'running', 'paused', 'killed', 'expired', 'failed'] as const;

/** Keys may not hold "=" (the list filter is `metadata=k=v`). */
export const MetadataSchema = z
  .record(z.string().min(1).max(128).regex(/^[^=\0]+$/, 'must not contain "=" or NUL'), z.string().max(1024).refine((s) => !s.includes('\0'), 'must not contain NUL bytes'))
  .refine((m) => Object.keys(m).length <= 64, 'at most 64 metadata pairs');

/** What a pause kept, so callers know what a resume will find. */
export const PauseInfoSchema = z.object({
  keepsMemory: z.boolean(),
  survivesRestart: z.boolean(),
  pausedAt: z.string(),
  /**
   * The TTL while paused: `suspended` (`onTimeout: pause`) — no end while paused, a resume starts
   * a full `spec.ttlMs` again; `running` — the sandbox still ends at `expiresAt`, paused or not.
   */
  ttl: z.enum(['suspended', 'running']),
  /** `call`: the next call acting inside it resumes it (`spec.autoResume`); `resume`: only a resume (or E2B connect) does. */
  resumesOn: z.enum(['call', 'resume']),
});

export const SandboxInfoSchema = z.object({
  sandboxId: z.string(),
  tenantId: z.string(),
  state: z.enum(SANDBOX_STATES),
  backend: z.string(),
  spec: SandboxSpecSchema,
  metadata: z.record(z.string(), z.string()),
  createdAt: z.string(),
  /** When the TTL ends the sandbox (ISO 8601). */
  expiresAt: z.string(),
  endedAt: z.string().optional(),
  /** Why it ended: `killed`, `expired`, `crashed: ...`, `server restarted`. */
  endReason: z.string().optional(),
  /** Set while paused. */
  pause: PauseInfoSchema.optional(),
  /** Where its files came from when not a template: the snapshot it was created from. */
  origin: z.object({ snapshotId: z.string() }).optional(),
});

export const SandboxPageSchema = z.object({ sandboxes: z.array(SandboxInfoSchema), nextCursor: z.string().nullable() });

export const SandboxIdParams = z.strictObject({ sandboxId: z.string().regex(SANDBOX_ID_PATTERN) });

export const CreateSandboxBody = z.strictObject({
  spec: z.unknown().optional().meta({ description: 'A SandboxSpecInput; validated by the engine (unknown keys are errors).' }),
  metadata: MetadataSchema.optional(),
  waitForCapacityMs: z
    .number()
    .int()
    .min(0)
    .optional()
    .meta({ description: "When the host cannot back the sandbox now, wait up to this long for room (first come first served) before CAPACITY_EXHAUSTED; at most the server's GET /v1/capacity maxWaitMs. Default 0: refused at once." }),
});

const oneOrMany = z.union([z.string(), z.array(z.string())]).transform((v) => (Array.isArray(v) ? v : [v]));

export const ListSandboxesQuery = z.strictObject({
  state: oneOrMany
    .transform((v) => v.flatMap((s) => s.split(',')).filter((s) => s !== ''))
    .pipe(z.array(z.enum(SANDBOX_STATES)))
    .optional()
    .meta({ description: `States to include, comma-separated or repeated: ${SANDBOX_STATES.join(', ')}` }),
  metadata: oneOrMany
    .pipe(z.array(z.string().regex(/^[^=]+=/, 'must be key=value')))
    .transform((pairs) => Object.fromEntries(pairs.map((p) => [p.slice(0, p.indexOf('=')), p.slice(p.indexOf('=') + 1)])))
    .optional()
    .meta({ description: 'key=value, repeated; a sandbox matches when every pair matches exactly' }),
  limit: queryNumber(4, 1, 1000).optional(),
  cursor: z.string().min(1).max(1024).optional().meta({ description: 'nextCursor of the previous page' }),
});

export const SetTimeoutBody = z.strictObject({ ttlMs: z.number().int().positive() });

export const PauseBody = z.strictObject({
  keepMemory: z.boolean().optional().meta({ description: 'Keep processes and their memory (default true); false ends the processes and keeps files.' }),
});

export type SandboxState = (typeof SANDBOX_STATES)[number];
export type SandboxInfo = z.output<typeof SandboxInfoSchema>;
export type PauseInfo = z.output<typeof PauseInfoSchema>;
export type SandboxPage = z.output<typeof SandboxPageSchema>;

/** States in which a sandbox holds host resources: what a crash leaves to recover. */
export const LIVE_STATES: readonly SandboxState[] = ['starting', 'running', 'paused'];

export function isLiveState(state: SandboxState): boolean {
  return LIVE_STATES.includes(state);
}
