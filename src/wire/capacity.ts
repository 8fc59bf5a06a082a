import { z } from 'zod';

const count = z.object({
  /** What the server admits. */
  limit: z.number().int(),
  /** Promised to live sandboxes (starting, running, paused, warm), creates under way included. */
  committed: z.number().int(),
  free: z.number().int(),
});

const bytes = z.object({ limitBytes: z.number(), committedBytes: z.number(), freeBytes: z.number() });

/**
 * What the server can still admit (GET /v1/capacity): sandbox slots, and what live sandboxes'
 * limits have been promised of the host's memory, task ids and workspace volume. A create fits
 * when its limits fit every `free`. Aggregates only: no other tenant's sandboxes are named.
 */
export const CapacityInfoSchema = z.object({
  sandboxes: count,
  /** The caller's tenant: its quota of concurrent sandboxes. */
  tenant: count.extend({ tenantId: z.string() }),
  /** Memory limits: `limitBytes` is (hostBytes − reserveBytes) × overcommit. */
  memory: bytes.extend({ hostBytes: z.number(), reserveBytes: z.number(), overcommit: z.number() }),
  /** pids limits plus each sandbox's launcher: `limit` is (host − reserve) × overcommit. */
  pids: count.extend({ host: z.number().int(), reserve: z.number().int(), overcommit: z.number() }),
  /** Disk limits on the workspace volume: `limitBytes` is what it can back × overcommit. */
  disk: bytes.extend({ overcommit: z.number() }),
  /** Creates waiting for room now (waitForCapacityMs), every tenant's. */
  waiting: z.number().int(),
  /** The longest waitForCapacityMs a create may ask for. */
  maxWaitMs: z.number().int(),
});

export type CapacityInfo = z.output<typeof CapacityInfoSchema>;
