import { constants } from 'node:fs';
import { lstat, open, readlink } from 'node:fs/promises';
import { join } from 'node:path';
import { SandboxError } from '../../errors/index.js';

const MAX_LINKS = 40;

export interface InRootPath {
  /** The host path, always under `root`. */
  hostPath: string;
  /** The path as seen inside the root, symlinks resolved. */
  inside: string;
  exists: boolean;
}

/**
 * Resolves `path` as a process chrooted at `root` would: `..` stops at the root and symlinks
 * (absolute or relative) are followed inside it, never out of it. Capsule writes into template
 * roots as host root, and a template's content is untrusted: an image's `/app -> /etc` must mean
 * the template's /etc, not the host's. The final component is followed when `followFinal`.
 * Nothing else writes to the root while this runs (a build step's snapshot belongs to the builder
 * until the step is published), so checking with lstat is not racy here.
 */
export async function resolveInRoot(root: string, path: string, options: { followFinal?: boolean; maxLookups?: number } = {}): Promise<InRootPath> {
  const followFinal = options.followFinal ?? true;
  const maxLookups = options.maxLookups ?? Number.POSITIVE_INFINITY;
  const current: string[] = [];
  const queue = path.split('/');
  let links = 0;
  let lookups = 0;
  while (queue.length > 0) {
    const part = queue.shift()!;
    if (part === '' || part === '.') continue;
    if (part === '..') {
      current.pop();
      continue;
    }
    // Links can make a short path cost tens of thousands of lookups (40 of them, each a long `a/..` run).
    if (++lookups > maxLookups) throw new SandboxError('INVALID_ARGUMENT', `resolving ${path} in the template takes more than ${maxLookups} lookups`, { details: { path } });
    const hostPath = join(root, ...current, part);
    const info = await lstat(hostPath).catch((error: NodeJS.ErrnoException) => {
      if (error.code === 'ENOENT' || error.code === 'ENOTDIR') return undefined;
      throw error;
    });
    if (!info) {
      current.push(part);
      // What does not exist yet cannot be a link: the rest is taken literally (`..` still clamped).
      for (const rest of queue) {
        if (rest === '..') current.pop();
        else if (rest !== '' && rest !== '.') current.push(rest);
      }
      return { hostPath: join(root, ...current), inside: `/${current.join('/')}`, exists: false };
    }
    const isLast = !queue.some((rest) => rest !== '' && rest !== '.');
    if (info.isSymbolicLink() && (!isLast || followFinal)) {
      if (++links > MAX_LINKS) throw new SandboxError('INVALID_ARGUMENT', `too many levels of symbolic links resolving ${path} in the template`, { details: { path } });
      const target = await readlink(hostPath);
      if (target.startsWith('/')) current.length = 0;
      queue.unshift(...target.split('/'));
      continue;
    }
    if (!isLast && !info.isDirectory()) {
      throw new SandboxError('NOT_A_DIRECTORY', `${`/${[...current, part].join('/')}`} is not a directory in the template (resolving ${path})`, { details: { path } });
    }
    current.push(part);
  }
  return { hostPath: join(root, ...current), inside: `/${current.join('/')}`, exists: true };
}

/**
 * Reads a small regular file of the template (`/etc/passwd`), following links inside the root,
 * with O_NOFOLLOW on the last hop. Undefined when it does not exist.
 */
export async function readFileInRoot(root: string, path: string, maxBytes = 4 * 1024 * 1024): Promise<string | undefined> {
  const resolved = await resolveInRoot(root, path);
  if (!resolved.exists) return undefined;
  const handle = await open(resolved.hostPath, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
  try {
    const info = await handle.stat();
    if (!info.isFile()) return undefined;
    if (info.size > maxBytes) throw new SandboxError('IMAGE_UNSUPPORTED', `${path} in the template is larger than ${maxBytes} bytes`);
    return await handle.readFile('utf8');
  } finally {
    await handle.close();
  }
}
