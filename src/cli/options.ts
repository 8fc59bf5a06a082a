import { InvalidArgumentError } from 'commander';
import { SandboxError } from '../errors/index.js';
import { parseBytes, parseDurationMs } from '../sandbox-spec/units.js';

/** commander parsers that turn a bad flag into a message naming the flag. */
export function bytesOption(flag: string) {
  return (value: string): number => {
    try {
      return parseBytes(value, flag);
    } catch (error) {
      throw new InvalidArgumentError((error as Error).message);
    }
  };
}

export function durationOption(flag: string) {
  return (value: string): number => {
    try {
      return parseDurationMs(value, flag);
    } catch (error) {
      throw new InvalidArgumentError((error as Error).message);
    }
  };
}

export function numberOption(flag: string) {
  return (value: string): number => {
    const n = Number(value);
    if (value.trim() === '' || !Number.isFinite(n)) throw new InvalidArgumentError(`${flag}: "${value}" is not a number`);
    return n;
  };
}

export function collect(value: string, previous: string[] = []): string[] {
  return [...previous, value];
}

/** A repeatable number flag (`--public-port 8000 --public-port 8001`). */
export function collectNumbers(flag: string) {
  const parse = numberOption(flag);
  return (value: string, previous: number[] = []): number[] => [...previous, parse(value)];
}

/** Parses repeated `key=value` flags (in an action, where a SandboxError is what gets reported). */
export function parsePairs(flag: string, pairs: string[]): Record<string, string> {
  const out: Record<string, string> = {};
  for (const pair of pairs) {
    const eq = pair.indexOf('=');
    if (eq <= 0) {
      throw new SandboxError('INVALID_ARGUMENT', `${flag}: "${pair}" is not key=value`, {
        details: { flag, value: pair },
        hint: `Write ${flag} NAME=value, once per pair.`,
      });
    }
    out[pair.slice(0, eq)] = pair.slice(eq + 1);
  }
  return out;
}

/** `--volume NAME:/path[:ro]` as a spec volume. */
export function parseVolumeFlag(value: string): { name: string; path: string; readOnly?: boolean } {
  const match = /^([^:]+):(\/[^:]*)(?::(ro|rw))?$/.exec(value);
  if (!match) {
    throw new SandboxError('INVALID_ARGUMENT', `--volume wants NAME:/path or NAME:/path:ro, not "${value}"`, {
      details: { flag: '--volume', value },
      hint: 'Name a volume of yours (capsule volume ls) and the absolute path to mount it at, e.g. --volume data:/data:ro.',
    });
  }
  return { name: match[1]!, path: match[2]!, ...(match[3] === 'ro' ? { readOnly: true } : {}) };
}
