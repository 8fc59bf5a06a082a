import { readFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { Help } from 'commander';
import { describe, expect, it } from 'vitest';
import { COMMANDS } from '../../src/cli/command-table.js';
import type { CliContext } from '../../src/cli/context.js';
import { commandName } from '../../src/cli/main.js';
import { mergeSpec } from '../../src/cli/spec-flags.js';

/**
 * What each CLI path loads, read from the source: a start-up regression (a static import of the
 * engine from main.ts, of zod from a client command) fails here, not in a benchmark later.
 */
const ROOT = resolve(import.meta.dirname, '..', '..');

/** Modules a file imports at load time: type-only imports are erased, dynamic ones wait. */
function staticImports(file: string): string[] {
  const text = readFileSync(file, 'utf8');
  const found: string[] = [];
  for (const match of text.matchAll(/(?:^|\n)\s*(import|export)\s+([^'";]*?)\s*from\s+['"]([^'"]+)['"]/g)) {
    const clause = match[2]!.trim();
    if (clause.startsWith('type ')) continue;
    const braces = /^\{([^}]*)\}$/.exec(clause);
    if (braces && braces[1]!.split(',').map((s) => s.trim()).filter(Boolean).every((s) => s.startsWith('type '))) continue;
    found.push(match[3]!);
  }
  for (const match of text.matchAll(/(?:^|\n)\s*import\s+['"]([^'"]+)['"]/g)) found.push(match[1]!);
  return found;
}

/** Every module `entry` loads before its first line runs: files under src/ and package names. */
function closure(entry: string): { files: string[]; packages: string[] } {
  const files = new Set<string>();
  const packages = new Set<string>();
  const visit = (file: string): void => {
    if (files.has(file)) return;
    files.add(file);
    for (const spec of staticImports(file)) {
      if (spec.startsWith('.')) visit(resolve(dirname(file), spec).replace(/\.js$/, '.ts'));
      else if (!spec.startsWith('node:')) packages.add(spec.startsWith('@') ? spec.split('/').slice(0, 2).join('/') : spec.split('/')[0]!);
    }
  };
  visit(join(ROOT, entry));
  return { files: [...files].map((f) => relative(ROOT, f)).sort(), packages: [...packages].sort() };
}

describe('what each CLI path loads', () => {
  it('bin/capsule.js answers --version with node:fs alone', () => {
    expect(staticImports(join(ROOT, 'bin', 'capsule.js'))).toEqual(['node:fs']);
  });

  it('main.ts loads commander and no command, engine, server, SDK or spec module', () => {
    const { files, packages } = closure('src/cli/main.ts');
    expect(packages).toEqual(['commander']);
    expect(files.filter((f) => /src\/(cli\/commands|engine|server|sdk|spec|store|host|backends)\//.test(f))).toEqual([]);
  });

  it('client commands (sandbox, files, artifacts, run-code) load neither zod nor the engine, server or SQLite', () => {
    for (const command of ['sandbox', 'files', 'artifacts', 'run-code']) {
      const { files, packages } = closure(`src/cli/commands/${command}.ts`);
      expect(packages, command).toEqual(['commander']);
      expect(files.filter((f) => /src\/(engine\/(?!interpreter\/types)|server|store|host|backends)/.test(f)), command).toEqual([]);
    }
  });

  it('capsule run loads the engine without the server, SQLite or ajv (reports and artifacts load on demand)', () => {
    const { files, packages } = closure('src/cli/commands/run.ts');
    expect(packages).toEqual(['commander', 'zod']);
    expect(files.filter((f) => /src\/(server|sdk|store)\//.test(f) || f.endsWith('engine/report.ts') || f.endsWith('engine/artifacts.ts'))).toEqual([]);
  });

  it('capsule run loads no egress network (proxy, resolver, nftables, netns pool): the first networked sandbox does', () => {
    const { files } = closure('src/cli/commands/run.ts');
    expect(files.filter((f) => /src\/host\/(netns-|nftables|egress\/(?!egress-types))/.test(f))).toEqual([]);
  });
});

describe('the command table', () => {
  const context: CliContext = { stdout: process.stdout, stderr: process.stderr, env: {}, exitCode: 0 };

  it('lists each command as the command itself describes it (top-level help needs no module)', async () => {
    const help = new Help();
    for (const entry of COMMANDS) {
      const command = await entry.load(context);
      expect(command.name()).toBe(entry.name);
      expect(command.description(), entry.name).toBe(entry.description);
      expect(help.subcommandTerm(command), entry.name).toBe(entry.term);
    }
  });

  it('finds the command argv names: the first operand, or the one after help; -- ends the search', () => {
    expect(commandName(['node', 'capsule', 'run', '--json', '--', 'sandbox'])).toBe('run');
    expect(commandName(['node', 'capsule', '--help'])).toBeUndefined();
    expect(commandName(['node', 'capsule', 'help', 'files'])).toBe('files');
    expect(commandName(['node', 'capsule', '-h', 'sandbox', 'create'])).toBe('sandbox');
  });
});

describe('mergeSpec (explicit flags over a --spec file)', () => {
  it('merges limits, network and env one level deep, replaces the rest, and skips what was not given', () => {
    const file = { backend: 'namespace', limits: { memoryBytes: 1, tmpBytes: 2 }, env: { A: 'file', B: 'file' }, ttlMs: 5 };
    const flags = { backend: 'gvisor', limits: { memoryBytes: 3, cpus: undefined }, network: { mode: undefined }, env: { B: 'flag' }, cwd: undefined };
    expect(mergeSpec(file, flags)).toEqual({ backend: 'gvisor', limits: { memoryBytes: 3, tmpBytes: 2 }, env: { A: 'file', B: 'flag' }, ttlMs: 5 });
  });

  it('keeps a file value that is not an object where a flag brings one, for the schema to name', () => {
    expect(mergeSpec({ limits: 7 }, { limits: { memoryBytes: 3 } })).toEqual({ limits: 7 });
    expect(mergeSpec({}, { limits: { memoryBytes: 3 } })).toEqual({ limits: { memoryBytes: 3 } });
  });
});
