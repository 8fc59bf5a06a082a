import { readFileSync } from 'node:fs';
import type { Command } from 'commander';
import { SandboxError } from '../errors/index.js';
import { bytesOption, collect, collectNumbers, numberOption, parsePairs } from './options.js';

/**
 * The spec flags `capsule run` and `capsule sandbox create` share. Any spec field is reachable:
 * the common ones have a flag, and `--spec FILE.json` carries the rest. The explicit flags are
 * merged over the file, field by field, and the result is validated where the API validates it
 * (the engine for `run`, the server for `create`): the same INVALID_SPEC naming the field.
 * Enumerated values (backend, network mode) are left to that validation too, not to the parser.
 */
export interface SpecFlags {
  spec?: string;
  backend?: string;
  template?: string;
  network?: string;
  allow?: string[];
  handle?: string[];
  /** `--public-port P`, repeatable. */
  publicPort?: number[];
  maxConnections?: number;
  memory?: number;
  cpus?: number;
  pids?: number;
  disk?: number;
  fileSize?: number;
  env?: string[];
}

/** A spec as JSON: validated by the schema where it is used, so only its shape is known here. */
export type SpecObject = Record<string, unknown>;

/** Adds the shared spec flags; the command adds its own time flags (TTL or wall clock). */
export function withSpecOptions(command: Command): Command {
  return command
    .option('--spec <file>', 'sandbox spec as JSON (a file, or - for stdin); the flags override its fields')
    .option('--backend <name>', 'isolation backend: namespace (default) or gvisor')
    .option('--template <name>', 'template the sandbox starts from (spec.template)')
    .option('--network <mode>', 'network access: none (default), allowlist or internet')
    .option('--allow <domain-or-cidr>', 'allowed destination (repeatable, with --network allowlist)', collect)
    .option('--handle <name>', 'credential-broker handle the sandbox may use (repeatable; needs a network)', collect)
    .option('--public-port <port>', 'a port inside the sandbox anyone may reach at its port URL, without a token (repeatable)', collectNumbers('--public-port'))
    .option('--max-connections <n>', 'outbound connections over its lifetime (default 4096)', numberOption('--max-connections'))
    .option('--memory <size>', 'memory limit, e.g. 256MiB (default 512MiB)', bytesOption('--memory'))
    .option('--cpus <n>', 'CPU cores (default 1)', numberOption('--cpus'))
    .option('--pids <n>', 'process limit (default 128)', numberOption('--pids'))
    .option('--disk <size>', 'workspace disk limit (default 512MiB)', bytesOption('--disk'))
    .option('--file-size <size>', 'largest file a process may write (default 64MiB)', bytesOption('--file-size'));
}

/**
 * The spec from `--spec` with the explicit flags over it. `extra` holds the command's own fields
 * (`ttlMs`, `cwd`, `limits.wallClockMs`, ...), in the spec's shape. Fields that were not given
 * are left out, so the file's value or the schema's default stands.
 */
export function specFromFlags(flags: SpecFlags, extra: SpecObject = {}): SpecObject {
  const explicit: SpecObject = {
    backend: flags.backend,
    template: flags.template,
    limits: {
      memoryBytes: flags.memory,
      cpus: flags.cpus,
      pids: flags.pids,
      diskBytes: flags.disk,
      fileSizeBytes: flags.fileSize,
    },
    network: { mode: flags.network, allow: flags.allow, handles: flags.handle, maxConnections: flags.maxConnections, publicPorts: flags.publicPort },
    env: flags.env === undefined ? undefined : parsePairs('--env', flags.env),
  };
  const base = flags.spec === undefined ? {} : readSpecFile(flags.spec);
  return mergeSpec(mergeSpec(base, explicit), extra);
}

/**
 * `over` merged onto `base`: a plain object one level deep (limits, network, env), anything else
 * replaced. Undefined values and empty objects in `over` change nothing. A `base` field that is
 * not an object where `over` has one is kept as it is, for the schema to name.
 */
export function mergeSpec(base: SpecObject, over: SpecObject): SpecObject {
  const merged: SpecObject = { ...base };
  for (const [key, value] of Object.entries(over)) {
    if (value === undefined) continue;
    if (!isPlainObject(value)) {
      merged[key] = value;
      continue;
    }
    const given = Object.fromEntries(Object.entries(value).filter(([, v]) => v !== undefined));
    if (Object.keys(given).length === 0) continue;
    const under = merged[key];
    if (under === undefined) merged[key] = given;
    else if (isPlainObject(under)) merged[key] = { ...under, ...given };
  }
  return merged;
}

/** Reads a `--spec` file (or stdin for `-`): a JSON object, else INVALID_SPEC saying why. */
export function readSpecFile(path: string): SpecObject {
  let text: string;
  try {
    text = readFileSync(path === '-' ? 0 : path, 'utf8');
  } catch (error) {
    throw new SandboxError('INVALID_ARGUMENT', `--spec: cannot read ${path} (${(error as NodeJS.ErrnoException).code ?? (error as Error).message})`, {
      details: { field: '--spec', path },
      hint: 'Give the path of a JSON file holding a sandbox spec, or - to read it from stdin.',
    });
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (error) {
    throw invalidSpec('(root)', `${path} is not JSON (${(error as Error).message.replace(/\s+/g, ' ')})`, path);
  }
  if (!isPlainObject(value)) throw invalidSpec('(root)', `${path} must hold a JSON object, e.g. {"limits": {"memoryBytes": 268435456}}`, path);
  return value;
}

function invalidSpec(field: string, message: string, file: string): SandboxError {
  return new SandboxError('INVALID_SPEC', `invalid sandbox spec: ${field}: ${message}`, {
    details: { issues: [{ field, message }], file },
    hint: 'Write the spec as one JSON object with the fields of the API (docs/api.md); sizes are numbers of bytes.',
  });
}

function isPlainObject(value: unknown): value is SpecObject {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}
