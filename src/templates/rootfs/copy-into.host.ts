import { createHash } from 'node:crypto';
import { constants } from 'node:fs';
import { lchown, lstat, lutimes, mkdir, open, rm, symlink, unlink } from 'node:fs/promises';
import { join, posix } from 'node:path';
import { SandboxError } from '../../errors/index.js';
import type { ContextEntry } from '../dockerfile/context.js';
import { resolveInRoot } from './in-root.js';

export interface CopyIntoOptions {
  /** The build context the entries are read from. */
  contextDir: string;
  /** The step's writable snapshot: the template root being built. */
  root: string;
  /** Absolute destination inside the root (WORKDIR already applied). */
  dest: string;
  destIsDir: boolean;
  uid: number;
  gid: number;
  /** --chmod: permissions for every file and directory copied. */
  mode?: number;
  signal?: AbortSignal;
}

/**
 * Applies a COPY to a template root, as root on the host: paths are resolved inside the root
 * (an image's symlinks cannot lead out of it), nothing is ever written through a symlink (an
 * existing link at a file's place is replaced, O_NOFOLLOW | O_EXCL on create), each source is
 * opened with O_NOFOLLOW and must still be the regular file whose hash the step's key was made
 * from, and owners are the raw ids the sandbox will see (0:0 unless --chown). Directories the copy
 * creates get the same owner; existing ones are left as they are.
 */
export async function copyInto(entries: readonly ContextEntry[], options: CopyIntoOptions): Promise<void> {
  const destDir = options.destIsDir ? options.dest : posix.dirname(options.dest);
  await mkdirInRoot(options.root, destDir, options);
  for (const entry of entries) {
    options.signal?.throwIfAborted();
    const inside = entry.target === '' ? options.dest : posix.join(options.dest, entry.target);
    if (entry.type === 'dir') {
      await mkdirInRoot(options.root, inside, options, entry.mode);
      continue;
    }
    await mkdirInRoot(options.root, posix.dirname(inside), options);
    const place = await resolveInRoot(options.root, inside, { followFinal: false });
    await clearPlace(place.hostPath, place.exists, inside);
    if (entry.type === 'symlink') {
      await symlink(entry.linkTarget!, place.hostPath);
      await lchown(place.hostPath, options.uid, options.gid);
    } else {
      await copyFile(join(options.contextDir, entry.rel), place.hostPath, entry, options);
    }
    await lutimes(place.hostPath, entry.mtimeMs / 1000, entry.mtimeMs / 1000);
  }
}

/** mkdir -p of an absolute path inside a template root, root-owned 0755 (WORKDIR, a RUN's cwd). */
export async function makeDirInRoot(root: string, inside: string): Promise<void> {
  await mkdirInRoot(root, inside, { contextDir: '', root, dest: inside, destIsDir: true, uid: 0, gid: 0 });
}

/** mkdir -p inside the root; created directories get the copy's owner and 0755 (or `mode`). */
async function mkdirInRoot(root: string, inside: string, options: CopyIntoOptions, mode?: number): Promise<void> {
  const parts = inside.split('/').filter((p) => p !== '' && p !== '.');
  let current = '/';
  for (const part of parts) {
    current = posix.join(current, part);
    const place = await resolveInRoot(root, current);
    if (place.exists) {
      if (!(await lstat(place.hostPath)).isDirectory()) {
        throw new SandboxError('NOT_A_DIRECTORY', `cannot copy into ${current}: it exists in the template and is not a directory`, { details: { path: current } });
      }
      continue;
    }
    const perms = options.mode ?? (current === posix.normalize(inside) && mode !== undefined ? mode : 0o755);
    await mkdir(place.hostPath, { mode: 0o700 });
    await lchown(place.hostPath, options.uid, options.gid);
    const handle = await open(place.hostPath, constants.O_RDONLY | constants.O_DIRECTORY | constants.O_NOFOLLOW);
    try {
      await handle.chmod(perms);
    } finally {
      await handle.close();
    }
  }
}

/** Makes room for a file or link: an old file or link goes, a directory there is an error. */
async function clearPlace(hostPath: string, exists: boolean, inside: string): Promise<void> {
  if (!exists) return;
  const info = await lstat(hostPath);
  if (info.isDirectory()) {
    throw new SandboxError('IS_A_DIRECTORY', `cannot copy a file to ${inside}: it is a directory in the template`, { details: { path: inside } });
  }
  await unlink(hostPath).catch(async () => rm(hostPath, { force: true }));
}

async function copyFile(source: string, target: string, entry: ContextEntry, options: CopyIntoOptions): Promise<void> {
  const input = await open(source, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
  try {
    const info = await input.stat();
    if (!info.isFile()) throw changed(entry.rel);
    const output = await open(target, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, 0o600);
    try {
      const hash = createHash('sha256');
      const buffer = Buffer.allocUnsafe(1024 * 1024);
      for (;;) {
        options.signal?.throwIfAborted();
        const { bytesRead } = await input.read(buffer, 0, buffer.length, null);
        if (bytesRead === 0) break;
        hash.update(buffer.subarray(0, bytesRead));
        await output.write(buffer, 0, bytesRead);
      }
      if (hash.digest('hex') !== entry.sha256) throw changed(entry.rel);
      await output.chown(options.uid, options.gid);
      // After chown, which would clear setuid and setgid bits.
      await output.chmod(options.mode ?? entry.mode);
    } finally {
      await output.close();
    }
  } finally {
    await input.close();
  }
}

function changed(rel: string): SandboxError {
  return new SandboxError('CONFLICT', `"${rel}" in the build context changed while the build ran`, {
    details: { path: rel },
    hint: 'Build again once nothing writes to the build context.',
  });
}
