import { z } from 'zod';

/**
 * Pieces every wire schema shares. The wire contract (this folder) is the one place where the
 * shapes that cross the API live: the engine, the server, OpenAPI and the SDK take their types
 * from here, so they cannot drift apart.
 */

/** Sandbox ids are 20 lowercase base-32 characters: safe in paths, cgroup names and URLs. */
export const SANDBOX_ID_PATTERN = /^[a-z2-7]{20}$/;

export const MAX_PATH_LENGTH = 4096;

export const noNul = z.string().refine((s) => !s.includes('\0'), 'must not contain NUL bytes');

/** Environment variable names a POSIX shell accepts. */
export const EnvName = z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'must be a valid environment variable name');

/** A path as the sandbox sees it; the file service resolves it (relative → under /workspace). */
export const SandboxPath = z.string().min(1).max(MAX_PATH_LENGTH).refine((s) => !s.includes('\0'), 'must not contain NUL bytes');

/** A number in a query string: digits only, at most `digits` of them, between min and max. */
export function queryNumber(digits: number, min: number, max: number, message = 'must be a number') {
  return z.string().regex(new RegExp(`^\\d{1,${digits}}$`), message).transform(Number).pipe(z.number().int().min(min).max(max));
}
