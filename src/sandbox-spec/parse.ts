import type { z } from 'zod';
import { SandboxError } from '../errors/index.js';
import { checkMaxima, DEFAULT_MAXIMA, type OperatorMaxima } from './maxima.js';
import { SandboxSpecSchema, type SandboxSpec } from './schema.js';

/** One line per zod issue, naming the field: `limits.memoryBytes: expected number`. */
export function describeIssues(error: z.ZodError): { field: string; message: string }[] {
  return error.issues.map((issue) => {
    const path = issue.path.map(String).join('.');
    const keys = 'keys' in issue && Array.isArray(issue.keys) ? ` (${issue.keys.join(', ')})` : '';
    return { field: path || '(root)', message: `${issue.message}${keys}` };
  });
}

/** Validates a spec, fills defaults and checks it against the operator's maxima. */
export function parseSpec(input: unknown, maxima: OperatorMaxima = DEFAULT_MAXIMA): SandboxSpec {
  const result = SandboxSpecSchema.safeParse(input ?? {});
  if (!result.success) {
    const issues = describeIssues(result.error);
    const first = issues[0];
    const summary = first ? `${first.field}: ${first.message}` : 'invalid spec';
    throw new SandboxError('INVALID_SPEC', `invalid sandbox spec: ${summary}`, {
      details: { issues },
      hint: 'Fix the named field; unknown keys are rejected and sizes are numbers of bytes.',
    });
  }
  checkMaxima(result.data, maxima);
  return result.data;
}
