import { lstatSync, readFileSync } from 'node:fs';
import { chmod, readFile, readdir, rename, rm, writeFile, copyFile } from 'node:fs/promises';
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { runCommand } from './run-command.host.js';
import { withLock } from './lock.host.js';

/** Parts of allowlisted /etc entries that never enter a sandbox, even unreadable. */
const EXCLUDED = ['ssl/private'];

/**
 * The whole /etc a namespace sandbox sees, as one directory bound read-only: copies of the
 * allowlisted host entries plus Capsule's synthetic passwd, group, hosts, resolv.conf, hostname.
 * One bind instead of ~25 halves bubblewrap's start-up. Rebuilt when a host entry changes.
 */
export async function prepareSandboxEtc(dataDir: string, syntheticDir: string, entries: readonly string[]): Promise<string> {
  const target = join(dataDir, 'sandbox-etc');
  // Synchronous: on every `capsule run`, a few dozen microsecond calls instead of as many
  // thread-pool round trips.
  const stamp = JSON.stringify(entries.map((e) => [e, lstatSync(`/etc/${e}`).mtimeMs]));
  if (readOrEmpty(join(dataDir, 'sandbox-etc.stamp')) === stamp) return target;
  return withLock(`${target}.lock`, () => rebuild(dataDir, target, stamp, syntheticDir, entries));
}

async function rebuild(dataDir: string, target: string, stamp: string, syntheticDir: string, entries: readonly string[]): Promise<string> {
  const current = await readFile(join(dataDir, 'sandbox-etc.stamp'), 'utf8').catch(() => '');
  if (current === stamp) return target;

  const suffix = `${process.pid}-${randomBytes(4).toString('hex')}`;
  const fresh = `${target}.new-${suffix}`;
  await rm(fresh, { recursive: true, force: true });
  await runCommand(['mkdir', '-m', '0755', fresh]);
  if (entries.length > 0) await runCommand(['cp', '-a', '--', ...entries.map((e) => `/etc/${e}`), `${fresh}/`]);
  for (const excluded of EXCLUDED) await rm(join(fresh, excluded), { recursive: true, force: true });
  for (const name of await readdir(syntheticDir)) {
    await rm(join(fresh, name), { recursive: true, force: true });
    await copyFile(join(syntheticDir, name), join(fresh, name));
    // The source is root's alone; the copy is read by the sandbox's uid through the bind.
    await chmod(join(fresh, name), 0o644);
  }
  const old = `${target}.old-${suffix}`;
  await rename(target, old).catch(() => undefined);
  await rename(fresh, target);
  await rm(old, { recursive: true, force: true });
  await writeFile(join(dataDir, 'sandbox-etc.stamp'), stamp, { mode: 0o600 });
  return target;
}

function readOrEmpty(path: string): string {
  try {
    return readFileSync(path, 'utf8');
  } catch {
    return '';
  }
}
