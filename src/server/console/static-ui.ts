import { existsSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { dirname, extname, join, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';
import { gzipSync } from 'node:zlib';
import type { FastifyInstance } from 'fastify';
import { SandboxError } from '../../errors/index.js';
import { sendError } from '../errors.js';

const CONTENT_TYPES: Record<string, string> = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
  '.ico': 'image/x-icon',
  '.json': 'application/json',
  '.woff2': 'font/woff2',
};

/**
 * The console speaks only to this server's API (connect-src 'self'), runs only its own scripts,
 * and cannot be framed. Inline styles are allowed: xterm.js and uPlot size their elements with
 * style attributes.
 */
const SECURITY_HEADERS = {
  'content-security-policy':
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; connect-src 'self'; font-src 'self' data:; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
  'x-content-type-options': 'nosniff',
  'referrer-policy': 'no-referrer',
  'x-frame-options': 'DENY',
};

/** Where `npm run build` puts the console: dist/console under the package root. */
export function defaultUiDir(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, 'package.json')) && dirname(dir) !== dir) dir = dirname(dir);
  return join(dir, 'dist', 'console');
}

/** A request path under /ui/ as a file of the build, or undefined when it could leave the folder. */
function fileOf(root: string, path: string): string | undefined {
  const relative = path === '' ? 'index.html' : path;
  if (!/^[A-Za-z0-9._/-]+$/.test(relative) || relative.split('/').some((part) => part === '' || part === '.' || part === '..')) return undefined;
  const file = resolve(root, relative);
  return file.startsWith(root + sep) ? file : undefined;
}

/**
 * `GET /ui/`: the web console's static files (built by `npm run build` into dist/console). They
 * are not API calls, so they do not pass the seam and are not in the OpenAPI document; the
 * console itself then calls the public API like any client.
 */
export function registerConsoleUi(app: FastifyInstance, uiDir: string = defaultUiDir()): void {
  const root = resolve(uiDir);
  // The build is immutable while the server runs: each file is compressed once.
  const gzipped = new Map<string, Buffer>();
  app.get('/ui', (_request, reply) => reply.redirect('/ui/'));
  app.get('/ui/*', async (request, reply) => {
    const path = (request.params as { '*': string })['*'];
    const file = fileOf(root, path);
    const body = file ? await readFile(file).catch(() => undefined) : undefined;
    if (!body) {
      const built = existsSync(join(root, 'index.html'));
      return sendError(
        request,
        reply,
        built
          ? new SandboxError('NOT_FOUND', `the console has no file ${path}`, { details: { path }, hint: 'Open /ui/.' })
          : new SandboxError('HOST_NOT_READY', 'the web console is not built on this server', {
              details: { uiDir: root },
              hint: 'Run `npm run build` (scripts/setup.sh does) and restart capsule serve.',
            }),
      );
    }
    const isAsset = path.startsWith('assets/');
    const type = CONTENT_TYPES[extname(file!)] ?? 'application/octet-stream';
    const acceptsGzip = /\bgzip\b/.test(String(request.headers['accept-encoding'] ?? ''));
    let payload: Buffer = body;
    if (acceptsGzip && /^(text\/|application\/json)/.test(type)) {
      payload = gzipped.get(file!) ?? gzipSync(body, { level: 9 });
      gzipped.set(file!, payload);
      reply.header('content-encoding', 'gzip');
    }
    return reply
      .headers(SECURITY_HEADERS)
      .header('vary', 'accept-encoding')
      .header('cache-control', isAsset ? 'public, max-age=31536000, immutable' : 'no-cache')
      .type(type)
      .send(payload);
  });
}
