import { z } from 'zod';

/** One reading of a sandbox's resource use. */
export const UsageSampleSchema = z.object({
  timestamp: z.string(),
  /** CPU used since the previous sample, as a share of the sandbox's `limits.cpus` (0–100). */
  cpuUsedPct: z.number(),
  /** CPU time used since the sandbox started. */
  cpuTimeMs: z.number(),
  memoryBytes: z.number(),
  /** Peak memory since the last exec reset the watermark. */
  memoryPeakBytes: z.number(),
  /** Workspace bytes as the disk limit counts them; null when the backend cannot tell. */
  diskBytes: z.number().nullable(),
});

/** One line of a process's kept log (NDJSON): when, which stream, the bytes as base64. */
export const LogLineSchema = z.object({ t: z.number(), stream: z.enum(['stdout', 'stderr']), data: z.string().meta({ description: 'base64' }) });

export type UsageSample = z.output<typeof UsageSampleSchema>;
