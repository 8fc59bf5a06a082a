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
 * REST), or undefined for the sandbox's own user. A process may run as any user of the sandbox's
 * template (the engine refuses users the host template does not have); file calls run as the
 * sandbox's user, so for them only that user (or none) is accepted rather than silently ignored.
 */
export function requestedUser(request: { headers: Record<string, unknown>; query?: unknown }): string | undefined {
  let name: string | undefined;
  const auth = request.headers.authorization;
  if (typeof auth === 'string' && /^Basic\s+/i.test(auth)) {
    name = Buffer.from(auth.replace(/^Basic\s+/i, ''), 'base64').toString('utf8').split(':')[0];
  }
  const query = request.query as { username?: unknown } | undefined;
  if (typeof query?.username === 'string') name = query.username;
  return name === undefined || name === '' ? undefined : name;
}

/** A file call's user: the sandbox's own (`user`) or none; any other is refused. */
export function checkUser(request: { headers: Record<string, unknown>; query?: unknown }): void {
  const name = requestedUser(request);
  if (name === undefined || name === E2B_USER) return;
  throw new ConnectError(
    'permission_denied',
    `file calls run as the sandbox's user "${E2B_USER}", not "${name}": omit the user option for files (commands may run as another user of a template, e.g. root)`,
  );
}
