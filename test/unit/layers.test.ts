import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';

const SRC = resolve(import.meta.dirname, '..', '..', 'src');

/**
 * Which top-level folders each folder may import (value imports and type imports alike): a strict
 * order with no exception, errors < sandbox-spec < wire < host < backends < templates < store < engine <
 * metrics < server < mcp < cli, the SDK on the wire contract alone, and MCP on the SDK and the
 * server's seam. Templates (storage and builds) stand on the host alone: the engine hands the
 * builder its RUN runtime through an interface.
 */
const ALLOWED: Record<string, string[]> = {
  errors: [],
  'sandbox-spec': ['errors'],
  wire: ['errors', 'sandbox-spec'],
  host: ['errors', 'sandbox-spec', 'wire'],
  backends: ['errors', 'sandbox-spec', 'wire', 'host'],
  templates: ['errors', 'sandbox-spec', 'wire', 'host'],
  store: ['errors', 'sandbox-spec', 'wire'],
  engine: ['errors', 'sandbox-spec', 'wire', 'host', 'backends', 'templates', 'store'],
  metrics: ['errors', 'sandbox-spec', 'wire', 'engine'],
  server: ['errors', 'sandbox-spec', 'wire', 'engine', 'templates', 'store', 'metrics'],
  sdk: ['errors', 'sandbox-spec', 'wire'],
  // MCP: tools on the SDK, served over stdio or as a route of the server's seam.
  mcp: ['errors', 'sandbox-spec', 'wire', 'sdk', 'server'],
  cli: ['errors', 'sandbox-spec', 'wire', 'engine', 'sdk', 'server', 'store', 'backends', 'templates', 'host', 'metrics', 'mcp'],
};

function files(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    return statSync(path).isDirectory() ? files(path) : path.endsWith('.ts') ? [path] : [];
  });
}

function imports(file: string): string[] {
  const text = readFileSync(file, 'utf8');
  return [...text.matchAll(/(?:^|\n)\s*(?:import|export)[^'"]*?from\s+['"]([^'"]+)['"]/g), ...text.matchAll(/import\(\s*['"]([^'"]+)['"]\s*\)/g)].map((m) => m[1]!);
}

const all = files(SRC);

describe('layering', () => {
  it('lower layers never import higher ones', () => {
    const violations: string[] = [];
    for (const file of all) {
      const layer = relative(SRC, file).split('/')[0]!;
      if (!(layer in ALLOWED)) continue;
      for (const spec of imports(file)) {
        if (!spec.startsWith('.')) continue;
        const target = relative(SRC, resolve(dirname(file), spec)).split('/')[0]!;
        if (target === layer || target.startsWith('..') || target.endsWith('.js')) continue;
        if (!ALLOWED[layer]!.includes(target)) violations.push(`${relative(SRC, file)} imports ${target} (${spec})`);
      }
    }
    expect(violations).toEqual([]);
  });

  it('only *.host.ts files spawn processes', () => {
    const spawners = all.filter((file) => imports(file).some((s) => s === 'node:child_process' || s === 'child_process'));
    const outside = spawners.map((f) => relative(SRC, f)).filter((f) => !f.endsWith('.host.ts'));
    expect(outside).toEqual([]);
  });

  it('never passes shell: true', () => {
    const offenders = all.filter((file) => /shell:\s*true/.test(readFileSync(file, 'utf8'))).map((f) => relative(SRC, f));
    expect(offenders).toEqual([]);
  });
});
