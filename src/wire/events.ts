import { z } from 'zod';
import { ExecReplySchema } from './artifacts.js';
import { WarningSchema } from './process.js';

/** A wire error in the middle of a stream: the server failed after the headers went out. */
export const StreamErrorSchema = z.object({ code: z.string(), message: z.string(), hint: z.string().optional(), requestId: z.string().optional() });

/** One NDJSON line of a process stream; stdout/stderr data is base64. */
export const ProcessEventSchema = z.discriminatedUnion('type', [
  z.object({ type: z.literal('start'), pid: z.number().int() }),
  z.object({ type: z.literal('stdout'), data: z.string().meta({ description: 'base64' }) }),
  z.object({ type: z.literal('stderr'), data: z.string().meta({ description: 'base64' }) }),
  z.object({ type: z.literal('warning'), warning: WarningSchema }),
  z.object({ type: z.literal('exit'), result: ExecReplySchema }),
  z.object({ type: z.literal('error'), error: StreamErrorSchema }),
]);

export type WireProcessEvent = z.output<typeof ProcessEventSchema>;
