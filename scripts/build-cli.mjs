// Bundles the `capsule` CLI (tsc's output under dist/src) into dist/cli/, run by `npm run build`.
// Why: node 20 loads ES modules file by file (resolve, read, compile, link) and `capsule run`
// reaches ~230 of them (zod alone is 95); one chunk per command path loads in about half the
// time. Each command's module stays a chunk of its own (command-table.ts imports them lazily), so
// a command still loads only what it runs. Only what the hot paths need is bundled: Capsule's own
// code, zod and commander. Other packages (fastify, better-sqlite3, ajv, typescript, ...) stay in
// node_modules and load from there when a path needs them.
import { execFileSync } from 'node:child_process';
import { rmSync, statSync, writeFileSync } from 'node:fs';
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

/**
 * Modules the snapshot may hold: node's snapshot builder refuses some built-ins (node:http) and
 * any addon or package outside the bundle. The bundle requires every external module at its top;
 * all others become a stand-in that requires the module on its first use, at run time, with a
 * real `require` (the builder's own knows built-ins only). What the run path uses lazily (the
 * egress network, the artifact index's SQLite) is loaded as lazily as in the ES module build.
 */
const SNAPSHOT_BUILTINS = new Set(['node:v8', 'node:path', 'node:fs', 'node:fs/promises', 'node:os', 'node:crypto', 'node:url', 'url', 'node:events', 'node:stream', 'node:stream/promises', 'node:process', 'node:child_process', 'node:util', 'node:buffer', 'node:string_decoder', 'node:timers/promises']);

// The startup snapshot of `capsule run` (decision 021). Node 20 loads no module from a compile
// cache, and a run spends most of its own time compiling and evaluating its modules and building
// its zod schemas; a V8 startup snapshot holds all of that done. Node builds a snapshot from one
// CommonJS file, so the run path is bundled again in that format, other commands left out.
const snapshotEntry = join(root, 'dist', 'src', 'cli', 'startup-snapshot.js');
const commandsDir = join(root, 'dist', 'src', 'cli', 'commands') + '/';
const snapshotBundle = await rolldown({
  input: snapshotEntry,
  platform: 'node',
  // Other commands are never loaded from the snapshot (bin/capsule sends them to bin/capsule.js).
  external: (id) =>
    (id.startsWith(commandsDir) && !id.endsWith('/run.js')) || (!id.startsWith('.') && !id.startsWith('/') && !BUNDLED.has(packageName(id))),
  logLevel: 'warn',
});
const snapshotFile = join(out, 'startup-snapshot.cjs');
const { output } = await snapshotBundle.generate({ format: 'cjs', codeSplitting: false });
await snapshotBundle.close();
writeFileSync(snapshotFile, lazyRequires(output[0].code));

function lazyRequires(code) {
  const lines = code.split('\n');
  let lazy = 0;
  const rewritten = lines.map((line, i) => {
    const found = /^let (\w+) = require\("([^"]+)"\);$/.exec(line);
    if (!found || SNAPSHOT_BUILTINS.has(found[2])) return line;
    lazy++;
    const [, name, id] = found;
    // rolldown follows `let x = require(...)` with `x = __toESM(x, n)` for a default import.
    const interop = new RegExp(`^${name} = (__toESM\\(${name}(?:, \\d)?\\));$`).exec(lines[i + 1] ?? '');
    if (interop) lines[i + 1] = '';
    const load = interop ? interop[1].replace(name, `__runtimeRequire(${JSON.stringify(id)})`) : `__runtimeRequire(${JSON.stringify(id)})`;
    return `let ${name} = __onFirstUse(() => ${load});`;
  });
  if (lazy === 0) return code;
  const helpers = [
    'const __runtimeRequire = (id) => require("node:module").createRequire(__filename)(id);',
    'const __onFirstUse = (load) => { let value; const get = () => (value ??= load()); return new Proxy({}, { get: (_, key) => get()[key], has: (_, key) => key in get(), ownKeys: () => Reflect.ownKeys(get()), getOwnPropertyDescriptor: (_, key) => { const d = Reflect.getOwnPropertyDescriptor(get(), key); return d && { ...d, configurable: true }; } }); };',
  ];
  const at = rewritten.findIndex((line) => /^(let|const|var) \w+ = require\(/.test(line));
  rewritten.splice(at, 0, ...helpers);
  return rewritten.join('\n');
}

// A snapshot works only in the node binary that built it: its name says which (size and mtime,
// what bin/capsule can read with one stat). Without one, bin/capsule runs bin/capsule.js.
const node = statSync(process.execPath);
const blob = join(out, `startup-${node.size}-${Math.floor(node.mtimeMs / 1000)}.blob`);
try {
  execFileSync(process.execPath, ['--snapshot-blob', blob, '--build-snapshot', snapshotFile], { cwd: out, stdio: ['ignore', 'ignore', 'pipe'] });
} catch (error) {
  rmSync(blob, { force: true });
  process.stderr.write(`capsule build: no startup snapshot (capsule run starts without one): ${String(error.stderr ?? error.message).trim().split('\n').slice(-3).join(' ')}\n`);
}
