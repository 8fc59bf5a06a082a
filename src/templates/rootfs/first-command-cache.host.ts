import { constants } from 'node:fs';
import { lstat, open, type FileHandle } from 'node:fs/promises';
import { posix } from 'node:path';
import { resolveInRoot } from './in-root.js';

/** A template's shell, loader and libc are a few MiB (Debian's: 2.3); a larger file is not read. */
const MAX_FILE_BYTES = 8 * 1024 * 1024;
/** What one root's warm-up reads at most, all files together. */
const MAX_ROOT_BYTES = 8 * 1024 * 1024;
/** Path lookups one resolution may take (a real root needs a handful). */
const MAX_LOOKUPS = 256;
const MAX_PROGRAM_HEADERS_BYTES = 64 * 1024;
const MAX_INTERPRETER_BYTES = 4096;
const PT_INTERP = 3;
/** What is read is thrown away: every warm-up may read into this one buffer at once. */
const scratch = Buffer.alloc(256 * 1024);

/**
 * Reads into the page cache what almost every first command in a new root reads: the user
 * database the agent looks each process's user up in (`/etc/passwd`, `/etc/group`), the loader's
 * cache (`/etc/ld.so.cache`, read by every dynamically linked program), the shell (`/bin/sh`), its
 * ELF interpreter and, beside a glibc loader, `libc.so.6` (musl's loader is its libc). A root is a btrfs snapshot of its template, and page cache belongs to an inode: each
 * root's files are inodes of their own, so without this a new sandbox's first command reads its
 * loader and libc from disk (first exec 6.9 ms against 2.1 from the host's own /usr, here). Run on
 * a spare root before a create takes it, so off the create's path; the pages are charged to the
 * server's memory cgroup, as any read of the host's is, and go with the root's inodes.
 *
 * The root is a template's, so untrusted: paths resolve inside it (resolveInRoot, at most
 * MAX_LOOKUPS lookups each), only what lstat calls a regular file is opened (O_NOFOLLOW,
 * O_NONBLOCK, checked again by fstat), at most MAX_ROOT_BYTES are read in all, nothing read is
 * kept. The root is a spare no sandbox has yet, so nothing changes it meanwhile. Best effort: a
 * root without a shell, or whose shell is no ELF program, warms what it has.
 */
export async function warmFirstCommand(root: string): Promise<void> {
  const files: string[] = [];
  for (const path of ['/etc/passwd', '/etc/group', '/etc/ld.so.cache']) {
    const file = await resolveFile(root, path);
    if (file !== undefined) files.push(file.hostPath);
  }
  const shell = await resolveFile(root, '/bin/sh');
  if (shell !== undefined) files.push(shell.hostPath);
  const interpreter = shell === undefined ? undefined : await withRegularFile(shell.hostPath, elfInterpreter);
  const loader = interpreter === undefined ? undefined : await resolveFile(root, interpreter);
  if (loader !== undefined) {
    files.push(loader.hostPath);
    const libc = await resolveFile(root, posix.join(posix.dirname(loader.inside), 'libc.so.6'));
    if (libc !== undefined) files.push(libc.hostPath);
  }
  let budget = MAX_ROOT_BYTES;
  for (const file of files) {
    if (budget <= 0) break;
    budget -= (await withRegularFile(file, (handle, size) => readThrough(handle, Math.min(size, budget)))) ?? 0;
  }
}

async function resolveFile(root: string, path: string): Promise<{ hostPath: string; inside: string } | undefined> {
  const resolved = await resolveInRoot(root, path, { maxLookups: MAX_LOOKUPS }).catch(() => undefined);
  return resolved?.exists ? resolved : undefined;
}

/** Runs `use` on `path` when it is a regular file of at most MAX_FILE_BYTES; undefined otherwise. */
async function withRegularFile<T>(path: string, use: (handle: FileHandle, size: number) => Promise<T | undefined>): Promise<T | undefined> {
  // Checked before the open: a device node or a FIFO is never opened (the volume is nodev too).
  const info = await lstat(path).catch(() => undefined);
  if (info === undefined || !info.isFile() || info.size > MAX_FILE_BYTES) return undefined;
  const handle = await open(path, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK).catch(() => undefined);
  if (handle === undefined) return undefined;
  try {
    const info = await handle.stat();
    return info.isFile() && info.size <= MAX_FILE_BYTES ? await use(handle, info.size) : undefined;
  } catch {
    return undefined;
  } finally {
    await handle.close();
  }
}

/** Reads the first `bytes` of the file; how many it read. */
async function readThrough(handle: FileHandle, bytes: number): Promise<number> {
  let position = 0;
  while (position < bytes) {
    const { bytesRead } = await handle.read(scratch, 0, Math.min(scratch.length, bytes - position), position);
    if (bytesRead === 0) break;
    position += bytesRead;
  }
  return position;
}

/** The PT_INTERP path of a little-endian ELF program (32- or 64-bit), or undefined. */
export async function elfInterpreter(handle: FileHandle, size: number): Promise<string | undefined> {
  const header = Buffer.alloc(64);
  if ((await handle.read(header, 0, 64, 0)).bytesRead < 52) return undefined;
  if (header.readUInt32BE(0) !== 0x7f454c46 || header[5] !== 1) return undefined;
  const wide = header[4] === 2;
  if (!wide && header[4] !== 1) return undefined;
  const tableAt = wide ? Number(header.readBigUInt64LE(0x20)) : header.readUInt32LE(0x1c);
  const entryBytes = header.readUInt16LE(wide ? 0x36 : 0x2a);
  const entries = header.readUInt16LE(wide ? 0x38 : 0x2c);
  const tableBytes = entryBytes * entries;
  if (entryBytes < (wide ? 56 : 32) || tableBytes > MAX_PROGRAM_HEADERS_BYTES || tableAt + tableBytes > size) return undefined;
  const table = Buffer.alloc(tableBytes);
  if ((await handle.read(table, 0, tableBytes, tableAt)).bytesRead < tableBytes) return undefined;
  for (let entry = 0; entry < entries; entry++) {
    const at = entry * entryBytes;
    if (table.readUInt32LE(at) !== PT_INTERP) continue;
    const offset = wide ? Number(table.readBigUInt64LE(at + 8)) : table.readUInt32LE(at + 4);
    const length = wide ? Number(table.readBigUInt64LE(at + 0x20)) : table.readUInt32LE(at + 16);
    if (length < 2 || length > MAX_INTERPRETER_BYTES || offset + length > size) return undefined;
    const path = Buffer.alloc(length);
    if ((await handle.read(path, 0, length, offset)).bytesRead < length) return undefined;
    // NUL-terminated; an interpreter is an absolute path.
    const text = path.toString('utf8', 0, path.indexOf(0) >= 0 ? path.indexOf(0) : length);
    return text.startsWith('/') ? text : undefined;
  }
  return undefined;
}
