import { z } from 'zod';
import { ERROR_CODES } from '../errors/index.js';

/** Every error reply of the API: `{ code, message, details?, hint?, requestId }`. */
export const ErrorBodySchema = z.object({
  code: z.enum(ERROR_CODES),
  message: z.string(),
  details: z.record(z.string(), z.unknown()).optional(),
  hint: z.string().optional(),
  requestId: z.string(),
});

export type ErrorBody = z.output<typeof ErrorBodySchema>;
