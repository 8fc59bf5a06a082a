import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';

const SRC = resolve(import.meta.dirname, '..', '..', 'src');

/**
 * Which top-level folders each folder may import (value imports and type imports alike): a strict
 * order with no exception, errors < sandbox-spec < wire < host < backends < templates < store < engine <
 * metrics < server < mcp < cli, the SDK on the wire contract alone, the agent tools and
 * framework adapters on the SDK, and MCP on those tools and the server's seam. Templates (storage and builds) stand on the host alone: the engine hands the
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
  // The tools for agents (one catalog) and the framework adapters: on the SDK only.
  'agent-tools': ['errors', 'sandbox-spec', 'wire', 'sdk'],
  // MCP: the tools, served over stdio or as a route of the server's seam.
  mcp: ['errors', 'sandbox-spec', 'wire', 'sdk', 'agent-tools', 'server'],
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

  it('loads an agent framework only in its adapter, and nothing in src loads an adapter', () => {
    // The core package never requires the optional peers (@langchain/core, ai, @openai/agents).
    const ADAPTERS: Record<string, RegExp> = {
      'agent-tools/langchain.ts': /^@langchain\//,
      'agent-tools/ai.ts': /^ai$/,
      'agent-tools/openai-agents.ts': /^@openai\/agents/,
      'agent-tools/openai-client.ts': /^@openai\/agents/,
      'agent-tools/openai-session.ts': /^@openai\/agents/,
      'agent-tools/openai-editor.ts': /^@openai\/agents/,
    };
    const frameworks = /^(@langchain\/|ai$|@ai-sdk\/|@openai\/agents)/;
    const OPENAI_PARTS = ['agent-tools/openai-client.ts', 'agent-tools/openai-session.ts', 'agent-tools/openai-editor.ts', 'agent-tools/openai-exec.ts'];
    const wrong: string[] = [];
    for (const file of all) {
      const name = relative(SRC, file);
      for (const spec of imports(file)) {
        if (frameworks.test(spec) && !(ADAPTERS[name]?.test(spec) ?? false)) wrong.push(`${name} imports ${spec}`);
        if (!spec.startsWith('.')) continue;
        const target = relative(SRC, resolve(dirname(file), spec)).replace(/\.js$/, '.ts');
        const isAdapterPart = target in ADAPTERS || OPENAI_PARTS.includes(target);
        const fromOpenAi = name === 'agent-tools/openai-agents.ts' || OPENAI_PARTS.includes(name);
        if (isAdapterPart && !(fromOpenAi && OPENAI_PARTS.includes(target))) wrong.push(`${name} imports the adapter ${target}`);
      }
    }
    expect(wrong).toEqual([]);
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
