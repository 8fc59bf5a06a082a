import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { SandboxFiles } from '../../engine/types.js';
import type { FileEntry } from '../../wire/index.js';
import { audited } from './audit.js';
import { readEnvelope, serverStream, unary, unaryBody } from './connect-protocol.js';
import type { E2bContext, PortConstraint } from './deps.js';
import { WATCH_EVENT_TYPES, registerEnvdWatchers, watchEventName } from './envd-watchers.js';
import { E2B_USER, checkUser, toE2bPath, toSandboxPath } from './paths.js';

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

export function registerEnvdFilesystem(app: FastifyInstance, ctx: E2bContext, constraints: PortConstraint): void {
  const { engine, tokens } = ctx;
  const filesOf = (request: Parameters<typeof tokens.verify>[0]) => {
    const access = tokens.verify(request);
    checkUser(request);
    return engine.files(access.tenantId, access.sandboxId);
  };
  /** A mutating call, audited like the v1 file routes (the path is the subject). */
  const changing = <T>(request: FastifyRequest, operation: string, subject: string, run: (files: SandboxFiles) => Promise<T>): Promise<T> => {
    const files = filesOf(request);
    return audited(ctx, request, tokens.verify(request), operation, { subject }, () => run(files));
  };

  app.post('/filesystem.Filesystem/Stat', { constraints }, (request, reply) =>
    unary(request, reply, async () => ({ entry: entryInfo(await filesOf(request).stat(toSandboxPath(unaryBody(request).path))) })),
  );

  app.post('/filesystem.Filesystem/ListDir', { constraints }, (request, reply) =>
    unary(request, reply, async () => {
      const body = unaryBody(request);
      const depth = typeof body.depth === 'number' && body.depth > 0 ? body.depth : 1;
      const entries = await filesOf(request).list(toSandboxPath(body.path), depth);
      return { entries: entries.map(entryInfo) };
    }),
  );

  app.post('/filesystem.Filesystem/MakeDir', { constraints }, (request, reply) =>
    unary(request, reply, async () => {
      const path = toSandboxPath(unaryBody(request).path);
      return { entry: entryInfo(await changing(request, 'files.mkdir', path, (files) => files.mkdir(path))) };
    }),
  );

  app.post('/filesystem.Filesystem/Move', { constraints }, (request, reply) =>
    unary(request, reply, async () => {
      const body = unaryBody(request);
      const [source, destination] = [toSandboxPath(body.source), toSandboxPath(body.destination)];
      const subject = JSON.stringify([source, destination]);
      return { entry: entryInfo(await changing(request, 'files.move', subject, (files) => files.move(source, destination))) };
    }),
  );

  app.post('/filesystem.Filesystem/Remove', { constraints }, (request, reply) =>
    unary(request, reply, async () => {
      const path = toSandboxPath(unaryBody(request).path);
      await changing(request, 'files.remove', path, (files) => files.remove(path));
      return {};
    }),
  );

  app.post('/filesystem.Filesystem/WatchDir', { constraints }, (request, reply) =>
    serverStream(request, reply, { keepalive: { keepalive: {} }, controller: new AbortController() }, async function* (clientGone) {
      const files = filesOf(request);
      const message = await readEnvelope(request);
      const root = toSandboxPath(message.path);
      // A watch never ends by itself: it ends with the client, or when the server closes.
      const signal = ctx.closeSignal ? AbortSignal.any([clientGone, ctx.closeSignal]) : clientGone;
      const watch = files.watch(root, { recursive: message.recursive === true, signal });
      // The SDK's watchDir resolves on `start`: changes after it must be reported.
      if ('ready' in watch) await (watch as { ready: Promise<void> }).ready;
      yield { start: {} };
      for await (const event of watch) yield { filesystem: { name: watchEventName(root, event.path), type: WATCH_EVENT_TYPES[event.type] } };
    }),
  );

  registerEnvdWatchers(app, ctx, constraints);
}
