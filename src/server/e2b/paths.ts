import { posix } from 'node:path';
import { ConnectError } from './connect-protocol.js';

/** E2B's user and home. In Capsule sandboxes /home/user is a symlink to /workspace. */
export const E2B_USER = 'user';
export const E2B_HOME = '/home/user';
const WORKSPACE = '/workspace';

/** A path from an E2B client as the engine's file service takes it (under /workspace). */
export function toSandboxPath(input: unknown): string {
  if (typeof input !== 'string' || input === '') throw new ConnectError('invalid_argument', 'path is required');
  let path = input === '~' ? E2B_HOME : input.startsWith('~/') ? `${E2B_HOME}/${input.slice(2)}` : input;
  if (!path.startsWith('/')) path = `${E2B_HOME}/${path}`;
  path = posix.normalize(path);
  if (path === E2B_HOME || path === `${E2B_HOME}/`) return WORKSPACE;
  return path.startsWith(`${E2B_HOME}/`) ? `${WORKSPACE}/${path.slice(E2B_HOME.length + 1)}` : path;
}

/** A path from the engine as E2B clients expect it (under /home/user). */
export function toE2bPath(path: string): string {
  if (path === WORKSPACE) return E2B_HOME;
  return path.startsWith(`${WORKSPACE}/`) ? `${E2B_HOME}/${path.slice(WORKSPACE.length + 1)}` : path;
}

/**
 * The envd user a call names (`Authorization: Basic base64("user:")` on RPC, `?username=` on
 * REST). Capsule sandboxes have one unprivileged user; asking for another one is refused rather
 * than silently running as `user`.
 */
export function checkUser(request: { headers: Record<string, unknown>; query?: unknown }): void {
  let name: string | undefined;
  const auth = request.headers.authorization;
  if (typeof auth === 'string' && /^Basic\s+/i.test(auth)) {
    name = Buffer.from(auth.replace(/^Basic\s+/i, ''), 'base64').toString('utf8').split(':')[0];
  }
  const query = request.query as { username?: unknown } | undefined;
  if (typeof query?.username === 'string') name = query.username;
  if (name === undefined || name === '' || name === E2B_USER) return;
  throw new ConnectError(
    'permission_denied',
    `user "${name}" does not exist in Capsule sandboxes: every process runs as the unprivileged "user" (uid 1000); omit the user option`,
  );
}
