/**
 * The package's entry points: every subpath export is the build of a source file, and each agent
 * framework an adapter imports is an optional peer dependency (the core package never installs
 * it), pinned exactly in devDependencies where the adapter's tests run against it.
 */
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';

const ROOT = resolve(import.meta.dirname, '..', '..');
const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as {
  exports: Record<string, string>;
  peerDependencies?: Record<string, string>;
  peerDependenciesMeta?: Record<string, { optional?: boolean }>;
  devDependencies: Record<string, string>;
  dependencies: Record<string, string>;
};

/** The npm package a bare import specifier names (`@scope/name/sub` → `@scope/name`). */
function packageOf(specifier: string): string {
  const parts = specifier.split('/');
  return specifier.startsWith('@') ? parts.slice(0, 2).join('/') : parts[0]!;
}

describe('package entry points', () => {
  it('exports the SDK and the three framework adapters, each built from a source file', () => {
    expect(Object.keys(pkg.exports)).toEqual(expect.arrayContaining(['.', './sdk', './langchain', './ai', './openai-agents']));
    for (const [subpath, target] of Object.entries(pkg.exports)) {
      const source = target.replace(/^\.\/dist\//, '').replace(/\.js$/, '.ts');
      expect(existsSync(join(ROOT, source)), `${subpath} → ${target} has no source ${source}`).toBe(true);
    }
  });

  it('declares each framework an adapter imports as an optional peer, pinned in devDependencies', () => {
    const dir = join(ROOT, 'src', 'agent-tools');
    const frameworks = new Set<string>();
    for (const name of readdirSync(dir).filter((file) => file.endsWith('.ts'))) {
      for (const match of readFileSync(join(dir, name), 'utf8').matchAll(/(?:^|\n)\s*(?:import|export)[^'"]*?from\s+'([^'.][^']*)'/g)) {
        const spec = match[1]!;
        if (spec.startsWith('node:') || spec === 'zod') continue;
        frameworks.add(packageOf(spec));
      }
    }
    expect([...frameworks].sort()).toEqual(['@langchain/core', '@openai/agents', 'ai']);
    for (const framework of frameworks) {
      expect(pkg.dependencies[framework], `${framework} must not be a dependency`).toBeUndefined();
      expect(pkg.peerDependencies?.[framework], `${framework} peer range`).toBeDefined();
      expect(pkg.peerDependenciesMeta?.[framework]?.optional, `${framework} optional`).toBe(true);
      expect(pkg.devDependencies[framework], `${framework} pinned for the tests`).toMatch(/^\d+\.\d+\.\d+$/);
    }
  });
});
