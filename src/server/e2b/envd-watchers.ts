import { randomBytes } from 'node:crypto';
import { posix } from 'node:path';
import type { FastifyRequest } from 'fastify';
import type { WatchEvent } from '../../wire/index.js';
import type { AnyRoute, Authenticate } from '../route.js';
import type { SandboxAccess } from './access.js';
import { ConnectError } from './connect-protocol.js';
import type { E2bContext, PortConstraint } from './deps.js';
import { envdService, reply, type Message } from './envd-rpc.js';
import { checkUser, toSandboxPath } from './paths.js';

/**
 * envd's polled watchers (CreateWatcher / GetWatcherEvents / RemoveWatcher), which E2B's
 * synchronous Python SDK uses instead of the WatchDir stream. Each is the engine's watch with
 * its events queued until the next poll.
 */

/** Events kept per watcher between polls; past it the oldest are dropped. */
const MAX_QUEUED_EVENTS = 10_000;
const MAX_WATCHERS = 1000;

interface Watcher {
  access: SandboxAccess;
  events: object[];
  controller: AbortController;
  failure?: Error;
}

export const WATCH_EVENT_TYPES: Record<WatchEvent['type'], string> = {
  create: 'EVENT_TYPE_CREATE',
  write: 'EVENT_TYPE_WRITE',
  remove: 'EVENT_TYPE_REMOVE',
  rename: 'EVENT_TYPE_RENAME',
  chmod: 'EVENT_TYPE_CHMOD',
};

/** The event name envd reports: the path relative to the watched directory. */
export function watchEventName(root: string, path: string): string {
  return posix.relative(root, path) || posix.basename(path);
}

export function envdWatcherRoutes(ctx: E2bContext, auth: Authenticate, constraints: PortConstraint): AnyRoute[] {
  const { engine } = ctx;
  const watchers = new Map<string, Watcher>();
  ctx.closeSignal.addEventListener('abort', () => {
    for (const watcher of watchers.values()) watcher.controller.abort();
    watchers.clear();
  }, { once: true });

  const watcherOf = (access: SandboxAccess, body: Record<string, unknown>): [string, Watcher] => {
    const id = body.watcherId ?? body.watcher_id;
    const watcher = typeof id === 'string' ? watchers.get(id) : undefined;
    if (!watcher || watcher.access.sandboxId !== access.sandboxId || watcher.access.tenantId !== access.tenantId) {
      throw new ConnectError('not_found', `watcher ${String(id)} not found in this sandbox`);
    }
    return [id as string, watcher];
  };

  const service = envdService('filesystem.Filesystem', auth, constraints);
  const rpc = (name: string, method: string, handler: (access: SandboxAccess, message: Message, request: FastifyRequest) => Promise<object> | object) =>
    service(`files.${name}`, method, async (access, message, request) => reply(await handler(access, message, request)));

  return [
    rpc('watcherCreate', 'CreateWatcher', async (access, body, request) => {
      checkUser(request);
      for (const [id, ended] of watchers) if (ended.failure !== undefined && watchers.size >= MAX_WATCHERS) watchers.delete(id);
      if (watchers.size >= MAX_WATCHERS) throw new ConnectError('resource_exhausted', `at most ${MAX_WATCHERS} watchers at once; remove some with RemoveWatcher`);
      const root = toSandboxPath(body.path);
      const watcher: Watcher = { access, events: [], controller: new AbortController() };
      const watch = engine.files(access.tenantId, access.sandboxId).watch(root, { recursive: body.recursive === true, signal: watcher.controller.signal });
      if ('ready' in watch) await (watch as { ready: Promise<void> }).ready;
      const id = `w-${randomBytes(8).toString('hex')}`;
      watchers.set(id, watcher);
      void (async () => {
        try {
          for await (const event of watch) {
            watcher.events.push({ name: watchEventName(root, event.path), type: WATCH_EVENT_TYPES[event.type] });
            if (watcher.events.length > MAX_QUEUED_EVENTS) watcher.events.shift();
          }
          watcher.failure = new ConnectError('not_found', 'the watcher ended: the sandbox stopped or the directory went away');
        } catch (error) {
          watcher.failure = error instanceof Error ? error : new Error(String(error));
        }
      })();
      return { watcherId: id };
    }),
    rpc('watcherEvents', 'GetWatcherEvents', (access, body) => {
      const [id, watcher] = watcherOf(access, body);
      const events = watcher.events.splice(0);
      if (events.length === 0 && watcher.failure !== undefined) {
        watchers.delete(id);
        throw watcher.failure;
      }
      return { events };
    }),
    rpc('watcherRemove', 'RemoveWatcher', (access, body) => {
      const [id, watcher] = watcherOf(access, body);
      watcher.controller.abort();
      watchers.delete(id);
      return {};
    }),
  ];
}
