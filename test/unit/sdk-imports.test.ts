import { mkdtemp, mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

/**
 * The SDK runs in agents' processes: it must never load code that spawns processes or touches the
 * host. This walks the import graph from src/sdk/index.ts by parsing import statements.
 */
const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..');

interface ImportEdge {
  from: string;
  specifier: string;
  typeOnly: boolean;
}

const IMPORT_PATTERNS = [
  // import x from '...', import { a } from '...', import type { T } from '...', export ... from '...'
  /^\s*(import|export)\s+(type\s+)?[^'";]*?\sfrom\s+['"]([^'"]+)['"]/gms,
  // import '...'
  /^\s*import\s+['"]([^'"]+)['"]/gm,
  // import('...'), require('...')
  /\b(?:import|require)\s*\(\s*['"]([^'"]+)['"]\s*\)/g,
];

function importsOf(file: string, source: string): ImportEdge[] {
  const edges: ImportEdge[] = [];
  for (const match of source.matchAll(IMPORT_PATTERNS[0]!)) {
    edges.push({ from: file, specifier: match[3]!, typeOnly: match[2] !== undefined });
  }
  for (const pattern of IMPORT_PATTERNS.slice(1)) {
    for (const match of source.matchAll(pattern)) edges.push({ from: file, specifier: match[1]!, typeOnly: false });
  }
  return edges;
}

/** Every rule the SDK's import graph breaks, as readable lines. */
async function violations(root: string, entry: string): Promise<string[]> {
  const problems: string[] = [];
  const visited = new Set<string>();
  const queue = [resolve(root, entry)];
  const rel = (path: string) => relative(root, path);
  while (queue.length > 0) {
    const file = queue.shift()!;
    if (visited.has(file)) continue;
    visited.add(file);
    for (const edge of importsOf(file, await readFile(file, 'utf8'))) {
      if (/^(node:)?child_process$/.test(edge.specifier)) {
        problems.push(`${rel(file)} imports ${edge.specifier}`);
        continue;
      }
      if (!edge.specifier.startsWith('.')) continue;
      const target = resolve(dirname(file), edge.specifier).replace(/\.js$/, '.ts');
      const layer = rel(target).split('/').slice(0, 2).join('/');
      const allowedTypeImport = edge.typeOnly && ['src/engine/result.ts', 'src/engine/types.ts', 'src/engine/interpreter/types.ts'].includes(rel(target));
      if (['src/backends', 'src/host', 'src/server'].includes(layer) || (layer === 'src/engine' && !allowedTypeImport)) {
        problems.push(`${rel(file)} imports ${rel(target)}${edge.typeOnly ? ' (type-only)' : ''}`);
      }
      // A type-only import is erased at compile time: nothing of it is loaded.
      if (!edge.typeOnly) queue.push(target);
    }
  }
  return problems;
}

describe('the SDK import graph', () => {
  it('loads no child_process and nothing of backends, host, engine or server', async () => {
    expect(await violations(ROOT, 'src/sdk/index.ts')).toEqual([]);
  });

  it('holds for the framework adapters too: they run in agents\' processes on the SDK alone', async () => {
    for (const entry of ['src/agent-tools/langchain.ts', 'src/agent-tools/ai.ts', 'src/agent-tools/openai-agents.ts']) {
      expect(await violations(ROOT, entry)).toEqual([]);
    }
  });

  it('catches a violation several imports deep (the walker itself works)', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'capsule-sdk-imports-'));
    try {
      await mkdir(join(dir, 'src/sdk'), { recursive: true });
      await mkdir(join(dir, 'src/engine'), { recursive: true });
      await mkdir(join(dir, 'src/util'), { recursive: true });
      await writeFile(join(dir, 'src/sdk/index.ts'), "export * from './a.js';\nimport type { T } from '../engine/types.js';\n");
      await writeFile(join(dir, 'src/sdk/a.ts'), "import { b } from '../util/b.js';\nexport { type ExecResult } from '../engine/result.js';\n");
      await writeFile(join(dir, 'src/util/b.ts'), "import {\n  spawn,\n} from 'node:child_process';\nconst x = await import('../engine/runner.js');\n");
      await writeFile(join(dir, 'src/engine/types.ts'), "import { spawn } from 'child_process';\n");
      await writeFile(join(dir, 'src/engine/result.ts'), '');
      await writeFile(join(dir, 'src/engine/runner.ts'), '');
      expect(await violations(dir, 'src/sdk/index.ts')).toEqual([
        'src/sdk/a.ts imports src/engine/result.ts',
        'src/util/b.ts imports node:child_process',
        'src/util/b.ts imports src/engine/runner.ts',
      ]);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});
