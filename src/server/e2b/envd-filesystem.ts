import type { FastifyRequest } from 'fastify';
import type { SandboxFiles } from '../../engine/types.js';
import type { FileEntry } from '../../wire/index.js';
import type { AnyRoute, Authenticate, RouteResult } from '../route.js';
import { serverStream } from './connect-protocol.js';
import type { E2bContext, PortConstraint } from './deps.js';
import { envdService, reply, type Message } from './envd-rpc.js';
import { WATCH_EVENT_TYPES, envdWatcherRoutes, watchEventName } from './envd-watchers.js';
import { E2B_USER, checkUser, toE2bPath, toSandboxPath } from './paths.js';
import { linkedSignal } from '../linked-signal.js';

/** envd's `filesystem.Filesystem` service over the engine's file service. */

const FILE_TYPES: Record<FileEntry['type'], string> = {
  file: 'FILE_TYPE_FILE',
  dir: 'FILE_TYPE_DIRECTORY',
  symlink: 'FILE_TYPE_SYMLINK',
  other: 'FILE_TYPE_UNSPECIFIED',
};

/** `-rw-r--r--` from the type and permission bits, as Go's fs.FileMode prints them. */
function permissions(entry: FileEntry): string {
  const kind = entry.type === 'dir' ? 'd' : entry.type === 'symlink' ? 'L' : '-';
  let bits = '';
  for (let shift = 6; shift >= 0; shift -= 3) {
    const triple = (entry.mode >> shift) & 7;
    bits += (triple & 4 ? 'r' : '-') + (triple & 2 ? 'w' : '-') + (triple & 1 ? 'x' : '-');
  }
  return kind + bits;
}

/** EntryInfo as envd sends it. Owner and group are the sandbox user's in its home and /tmp. */
export function entryInfo(entry: FileEntry): object {
  const path = toE2bPath(entry.path);
  const owned = path.startsWith('/home/user') || path.startsWith('/tmp');
  return {
    name: entry.name,
    type: FILE_TYPES[entry.type],
    path,
    size: String(entry.size),
    mode: entry.mode & 0o7777,
    permissions: permissions(entry),
    owner: owned ? E2B_USER : 'root',
    group: owned ? E2B_USER : 'root',
    modifiedTime: entry.modifiedAt,
    ...(entry.symlinkTarget !== undefined ? { symlinkTarget: toE2bPath(entry.symlinkTarget) } : {}),
  };
}

/** The file service of the caller's sandboxes, for the envd user named in the call. */
type FilesHandler = (files: SandboxFiles, message: Message, request: FastifyRequest) => RouteResult | Promise<RouteResult>;

export function envdFilesystemRoutes(ctx: E2bContext, auth: Authenticate, constraints: PortConstraint): AnyRoute[] {
  const service = envdService('filesystem.Filesystem', auth, constraints);
  const rpc = (name: string, method: string, handler: FilesHandler, subject?: (message: Message) => string) =>
    service(`files.${name}`, method, (access, message, request) => {
      checkUser(request);
      return handler(ctx.engine.files(access.tenantId, access.sandboxId), message, request);
    }, subject);
  const json = reply;

  return [
    rpc('stat', 'Stat', async (files, body) => json({ entry: entryInfo(await files.stat(toSandboxPath(body.path))) })),
    rpc('list', 'ListDir', async (files, body) => {
      const depth = typeof body.depth === 'number' && body.depth > 0 ? body.depth : 1;
      return json({ entries: (await files.list(toSandboxPath(body.path), depth)).map(entryInfo) });
    }),
    rpc('mkdir', 'MakeDir', async (files, body) => json({ entry: entryInfo(await files.mkdir(toSandboxPath(body.path))) }), (body) => toSandboxPath(body.path)),
    rpc(
      'move',
      'Move',
      async (files, body) => json({ entry: entryInfo(await files.move(toSandboxPath(body.source), toSandboxPath(body.destination))) }),
      (body) => JSON.stringify([toSandboxPath(body.source), toSandboxPath(body.destination)]),
    ),
    rpc(
      'remove',
      'Remove',
      async (files, body) => {
        await files.remove(toSandboxPath(body.path));
        return json({});
      },
      (body) => toSandboxPath(body.path),
    ),
    rpc('watch', 'WatchDir', (files, message, request) => ({
      kind: 'stream',
      write: (reply) =>
        serverStream(request, reply, { keepalive: { keepalive: {} }, controller: new AbortController() }, async function* (clientGone) {
          const root = toSandboxPath(message.path);
          // A watch never ends by itself: it ends with the client, or when the server closes.
          const { signal, release } = linkedSignal(clientGone, ctx.closeSignal);
          try {
            const watch = files.watch(root, { recursive: message.recursive === true, signal });
            // The SDK's watchDir resolves on `start`: changes after it must be reported.
            if ('ready' in watch) await (watch as { ready: Promise<void> }).ready;
            yield { start: {} };
            for await (const event of watch) yield { filesystem: { name: watchEventName(root, event.path), type: WATCH_EVENT_TYPES[event.type] } };
          } finally {
            release();
          }
        }),
    })),
    ...envdWatcherRoutes(ctx, auth, constraints),
  ];
}
