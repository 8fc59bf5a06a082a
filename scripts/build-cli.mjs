// Bundles the `capsule` CLI (tsc's output under dist/src) into dist/cli/, run by `npm run build`.
// Why: node 20 loads ES modules file by file (resolve, read, compile, link) and `capsule run`
// reaches ~230 of them (zod alone is 95); one chunk per command path loads in about half the
// time. Each command's module stays a chunk of its own (command-table.ts imports them lazily), so
// a command still loads only what it runs. Only what the hot paths need is bundled: Capsule's own
// code, zod and commander. Other packages (fastify, better-sqlite3, ajv, typescript, ...) stay in
// node_modules and load from there when a path needs them.
import { rmSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { rolldown } from 'rolldown';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const out = join(root, 'dist', 'cli');
const BUNDLED = new Set(['zod', 'commander']);

/** `zod/v4/core` -> `zod`, `@scope/pkg/x` -> `@scope/pkg`. */
function packageName(id) {
  const parts = id.split('/');
  return id.startsWith('@') ? parts.slice(0, 2).join('/') : parts[0];
}

rmSync(out, { recursive: true, force: true });
const bundle = await rolldown({
  input: { capsule: join(root, 'dist', 'src', 'cli', 'main.js') },
  platform: 'node',
  external: (id) => !id.startsWith('.') && !id.startsWith('/') && !BUNDLED.has(packageName(id)),
  logLevel: 'warn',
});
await bundle.write({ dir: out, format: 'esm', entryFileNames: '[name].js', chunkFileNames: '[name]-[hash].js' });
await bundle.close();
