import { constants, type Stats } from 'node:fs';
import { lstat, open, readdir, readlink, realpath, type FileHandle } from 'node:fs/promises';
import { join, posix } from 'node:path';
import { SandboxError } from '../errors/index.js';

/**
 * Reading a sandbox's files from the host without ever leaving the sandbox: every component is
 * checked with lstat, files are opened with O_NOFOLLOW and matched to what lstat saw, and a
 * symlink is reported, never followed (a link the sandbox made may name any host path). The
 * caller freezes the sandbox first, so nothing swaps a component between the check and the open.
 */

export const WORKSPACE = '/workspace';

export interface OutputEntry {
  /** Path relative to the walked directory, with `/` separators. */
  name: string;
  hostPath: string;
  kind: 'file' | 'symlink' | 'special';
  size: number;
  mtimeMs: number;
}

export interface WalkOptions {
  /** Entries past this count are not listed; `truncated` says so. @default 10000 */
  maxEntries?: number;
  /** Directories deeper than this are not entered. @default 32 */
  maxDepth?: number;
}

export interface WalkResult {
  entries: OutputEntry[];
  truncated: boolean;
}

export type ResolvedPath =
  | { kind: 'missing' }
  /** The path, or a directory on the way to it, is a symlink: not followed. */
  | { kind: 'symlink' }
  | { kind: 'found'; hostPath: string; info: Stats };

/**
 * Resolves a sandbox path under /workspace to its host path without following any symlink on
 * the way (a link is reported as such). Paths outside /workspace are INVALID_PATH; relative paths
 * resolve against /workspace.
 */
export async function resolveWorkspacePath(workspaceDir: string, sandboxPath: string): Promise<ResolvedPath> {
  const normalized = normalizeWorkspacePath(sandboxPath);
  let hostPath = workspaceDir;
  let info = await lstat(hostPath);
  for (const part of normalized.slice(WORKSPACE.length).split('/').filter(Boolean)) {
    if (!info.isDirectory()) return { kind: 'missing' };
    hostPath = join(hostPath, part);
    const next = await lstat(hostPath).catch(() => undefined);
    if (!next) return { kind: 'missing' };
    if (next.isSymbolicLink()) return { kind: 'symlink' };
    info = next;
  }
  return { kind: 'found', hostPath, info };
}

/** `/workspace`-anchored, normalized form of a sandbox path; anything outside is INVALID_PATH. */
export function normalizeWorkspacePath(sandboxPath: string): string {
  const absolute = posix.normalize(posix.isAbsolute(sandboxPath) ? sandboxPath : posix.join(WORKSPACE, sandboxPath)).replace(/\/+$/, '');
  if (sandboxPath.includes('\0') || (absolute !== WORKSPACE && !absolute.startsWith(`${WORKSPACE}/`))) {
    throw new SandboxError('INVALID_PATH', `${sandboxPath.replace(/\0/g, '\\0')} is outside /workspace; results are collected only from /workspace`, {
      details: { path: sandboxPath.replace(/\0/g, '\\0') },
      hint: 'Name a directory under /workspace, e.g. /workspace/output.',
    });
  }
  return absolute;
}

/** Lists regular files, symlinks and special files under `root` (a checked host directory). */
export async function walkOutput(root: string, options: WalkOptions = {}): Promise<WalkResult> {
  const maxEntries = options.maxEntries ?? 10_000;
  const maxDepth = options.maxDepth ?? 32;
  const result: WalkResult = { entries: [], truncated: false };
  const visit = async (dir: string, prefix: string, depth: number): Promise<void> => {
    for (const name of (await readdir(dir)).sort()) {
      if (result.entries.length >= maxEntries) {
        result.truncated = true;
        return;
      }
      const hostPath = join(dir, name);
      const rel = prefix ? `${prefix}/${name}` : name;
      const info = await lstat(hostPath);
      if (info.isDirectory()) {
        if (depth >= maxDepth) result.truncated = true;
        else await visit(hostPath, rel, depth + 1);
        continue;
      }
      const kind = info.isSymbolicLink() ? 'symlink' : info.isFile() ? 'file' : 'special';
      result.entries.push({ name: rel, hostPath, kind, size: info.size, mtimeMs: info.mtimeMs });
    }
  };
  await visit(root, '', 0);
  return result;
}

/**
 * Opens a regular file without following a final symlink (O_NOFOLLOW) and without blocking on a
 * FIFO (O_NONBLOCK); returns undefined when what is there now is not a regular file, or when the
 * opened file is not inside `root` (a directory on the way was swapped for a link after it was
 * checked — possible only when the sandbox is not frozen). `root` is a real path.
 */
export async function openRegular(hostPath: string, root: string): Promise<{ handle: FileHandle; info: Stats } | undefined> {
  let handle: FileHandle;
  try {
    handle = await open(hostPath, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === 'ELOOP' || code === 'ENOENT' || code === 'ENXIO' || code === 'ENOTDIR') return undefined;
    throw error;
  }
  const info = await handle.stat();
  const opened = await readlink(`/proc/self/fd/${handle.fd}`).catch(() => '');
  if (!info.isFile() || !opened.startsWith(`${root}/`)) {
    await handle.close();
    return undefined;
  }
  return { handle, info };
}

export type BoundedRead =
  | { kind: 'missing' }
  | { kind: 'not_regular'; reason: 'symlink' | 'special' }
  | { kind: 'too_large'; size: number }
  | { kind: 'ok'; data: Buffer };

/** Reads a sandbox file of at most `maxBytes`; never reads more than `maxBytes + 1` bytes. */
export async function readBounded(workspaceDir: string, sandboxPath: string, maxBytes: number): Promise<BoundedRead> {
  const resolved = await resolveWorkspacePath(workspaceDir, sandboxPath);
  if (resolved.kind === 'missing') return { kind: 'missing' };
  if (resolved.kind === 'symlink') return { kind: 'not_regular', reason: 'symlink' };
  if (!resolved.info.isFile()) return { kind: 'not_regular', reason: 'special' };
  if (resolved.info.size > maxBytes) return { kind: 'too_large', size: resolved.info.size };
  const opened = await openRegular(resolved.hostPath, await realpath(workspaceDir));
  if (!opened) return { kind: 'not_regular', reason: 'symlink' };
  try {
    const buffer = Buffer.alloc(maxBytes + 1);
    let length = 0;
    while (length < buffer.length) {
      const { bytesRead } = await opened.handle.read(buffer, length, buffer.length - length, length);
      if (bytesRead === 0) break;
      length += bytesRead;
    }
    if (length > maxBytes) return { kind: 'too_large', size: Math.max(opened.info.size, length) };
    return { kind: 'ok', data: buffer.subarray(0, length) };
  } finally {
    await opened.handle.close();
  }
}
