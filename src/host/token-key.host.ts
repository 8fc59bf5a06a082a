import { randomBytes } from 'node:crypto';
import { chmodSync, closeSync, fstatSync, linkSync, mkdirSync, openSync, readFileSync, rmSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { SandboxError } from '../errors/index.js';

/** Bytes of the instance's token key. */
const KEY_BYTES = 32;

/** Where the key lives under the data directory (0600 in a 0700 directory, root's). */
export function tokenKeyPath(dataDir: string): string {
  return join(dataDir, 'keys', 'tokens.key');
}

/**
 * The key every access token and signed URL of this instance is made with: 32 random bytes made
 * at the first start and kept in `<dataDir>/keys/tokens.key`, so tokens a client holds stay
 * valid when the server restarts. Made once, by one rename-free `link` (two starts racing keep
 * the first); a key file left with group or other bits is closed to 0600, one of the wrong size
 * is an error (never silently replaced: that would void every token in use).
 */
export function loadTokenKey(dataDir: string): Buffer {
  const path = tokenKeyPath(dataDir);
  mkdirSync(join(dataDir, 'keys'), { recursive: true, mode: 0o700 });
  chmodSync(join(dataDir, 'keys'), 0o700);
  const existing = readKey(path);
  if (existing) return existing;
  const temp = `${path}.${process.pid}.tmp`;
  const fd = openSync(temp, 'wx', 0o600);
  try {
    writeSync(fd, randomBytes(KEY_BYTES));
  } finally {
    closeSync(fd);
  }
  try {
    linkSync(temp, path);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw error;
  } finally {
    rmSync(temp, { force: true });
  }
  const made = readKey(path);
  if (!made) throw new SandboxError('HOST_NOT_READY', `the token key ${path} could not be made`);
  return made;
}

function readKey(path: string): Buffer | undefined {
  let fd: number;
  try {
    fd = openSync(path, 'r');
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw error;
  }
  try {
    const info = fstatSync(fd);
    if ((info.mode & 0o077) !== 0) chmodSync(path, 0o600);
    const key = readFileSync(fd);
    if (key.length !== KEY_BYTES) {
      throw new SandboxError('HOST_NOT_READY', `the token key ${path} holds ${key.length} bytes, not ${KEY_BYTES}`, {
        hint: 'Restore the file from a backup; removing it makes a new key, and every access token and signed URL issued so far stops working.',
      });
    }
    return key;
  } finally {
    closeSync(fd);
  }
}
