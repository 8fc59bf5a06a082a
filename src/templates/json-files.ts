import { readFileSync } from 'node:fs';
import { mkdir, open, readFile, readdir, rename, rm } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { ownedName } from './owner.js';

/**
 * Writes `value` as JSON to `path` atomically: a temp file in the same directory (0600), flushed,
 * then renamed over the old one. A reader in another process (a CLI beside a server) sees the old
 * file or the new one, never half of one.
 */
export async function writeJsonAtomic(path: string, value: unknown): Promise<void> {
  await mkdir(dirname(path), { recursive: true, mode: 0o700 });
  const temp = `${path}.${ownedName()}.tmp`;
  const handle = await open(temp, 'wx', 0o600);
  try {
    await handle.writeFile(`${JSON.stringify(value, null, 1)}\n`);
    await handle.sync();
  } finally {
    await handle.close();
  }
  try {
    await rename(temp, path);
  } catch (error) {
    await rm(temp, { force: true });
    throw error;
  }
}

/** The parsed file, or undefined when it does not exist. */
export async function readJson<T>(path: string): Promise<T | undefined> {
  try {
    return JSON.parse(await readFile(path, 'utf8')) as T;
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw error;
  }
}

/**
 * readJson, synchronously: for the lookups on every create from a template (a name index and a
 * record, each a few hundred bytes in the page cache), which took ~1 ms as four thread-pool
 * round trips per file and take microseconds as one call.
 */
export function readJsonNow<T>(path: string): T | undefined {
  try {
    return JSON.parse(readFileSync(path, 'utf8')) as T;
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw error;
  }
}

/** Names of `*.json` files in `dir` without the extension (temps are left out). */
export async function jsonNames(dir: string): Promise<string[]> {
  const entries = await readdir(dir).catch(() => [] as string[]);
  return entries.filter((e) => e.endsWith('.json')).map((e) => e.slice(0, -'.json'.length));
}

export function jsonPath(dir: string, name: string): string {
  return join(dir, `${name}.json`);
}
