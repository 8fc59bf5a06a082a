import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { lstat, open, readdir, readFile, readlink } from 'node:fs/promises';
import { constants } from 'node:fs';
import { join, posix } from 'node:path';
import { resolveInRoot } from '../rootfs/in-root.js';
import { hasExceptions, isIgnored, parseDockerignore, patternRegex, type IgnorePattern } from './dockerignore.js';

/** Entries one COPY may select; a context past it is refused rather than hashed for minutes. */
const MAX_ENTRIES = 200_000;

/** One thing a COPY puts into the template. */
export interface ContextEntry {
  /** Path relative to the context root (posix). */
  rel: string;
  /** Path relative to the COPY's destination; '' is the destination itself. */
  target: string;
  type: 'file' | 'dir' | 'symlink';
  /** Permission bits (& 07777). */
  mode: number;
  size: number;
  linkTarget?: string;
  /** sha256 of a file's content. */
  sha256?: string;
  mtimeMs: number;
}

export interface CopySelection {
  entries: ContextEntry[];
  /** True when the destination is a directory the entries go into (Docker's rules). */
  destIsDir: boolean;
  /**
   * sha256 over the sorted (target, type, mode, size, link target, content sha256) of every entry:
   * no mtime and no owner, so a fresh checkout of the same files hits the cache (R1 §6).
   */
  digest: string;
}

export class BuildContext {
  private ignore: IgnorePattern[] | undefined;
  private all: string[] | undefined;

  constructor(readonly dir: string) {}

  /** `.dockerignore` of the context (none is an empty list). */
  async patterns(): Promise<IgnorePattern[]> {
    this.ignore ??= parseDockerignore(await readFile(join(this.dir, '.dockerignore'), 'utf8').catch(() => ''));
    return this.ignore;
  }

  /**
   * What `COPY sources… dest` selects: each source relative to the context (never out of it, never
   * through a symbolic link), wildcards matched against the context's paths, directories copied
   * by their contents, `.dockerignore` applied. `fail(message)` raises the caller's error.
   */
  async select(sources: string[], dest: string, fail: (message: string) => never): Promise<CopySelection> {
    const ignore = await this.patterns();
    const matched: string[] = [];
    for (const source of sources) {
      const cleaned = posix.normalize(`/${source}`).slice(1).replace(/\/+$/, '');
      if (source.split('/').includes('..') && posix.normalize(source).startsWith('..')) fail(`COPY source "${source}" is outside the build context`);
      if (/[*?[]/.test(cleaned)) {
        const regex = patternRegex(cleaned);
        const hits = (await this.allPaths()).filter((path) => regex.test(path) && !isIgnored(path, ignore));
        if (hits.length === 0) fail(`COPY source "${source}" matches nothing in the build context`);
        matched.push(...hits);
        continue;
      }
      if (cleaned !== '' && isIgnored(cleaned, ignore)) fail(`COPY source "${source}" is excluded by .dockerignore`);
      const resolved = await resolveInRoot(this.dir, cleaned, { followFinal: false });
      if (!resolved.exists) fail(`COPY source "${source}" is not in the build context (${this.dir})`);
      if (resolved.inside !== `/${cleaned}`) fail(`COPY source "${source}" goes through a symbolic link; name the real path`);
      matched.push(cleaned);
    }
    const singleDir = matched.length === 1 && (await lstat(join(this.dir, matched[0]!))).isDirectory();
    const destIsDir = dest.endsWith('/') || matched.length > 1 || singleDir;
    if (matched.length > 1 && !dest.endsWith('/')) fail(`COPY with more than one source needs a destination directory ending in "/" (not "${dest}")`);
    const entries: ContextEntry[] = [];
    for (const rel of matched) {
      const info = await lstat(join(this.dir, rel));
      if (info.isDirectory()) await this.walk(rel, '', entries, ignore, fail);
      else entries.push(await this.entry(rel, destIsDir ? posix.basename(rel) : '', fail));
      if (entries.length > MAX_ENTRIES) fail(`COPY selects more than ${MAX_ENTRIES} files; add a .dockerignore`);
    }
    return { entries, destIsDir, digest: digestOf(entries) };
  }

  private async walk(rel: string, target: string, out: ContextEntry[], ignore: IgnorePattern[], fail: (m: string) => never): Promise<void> {
    const names = (await readdir(join(this.dir, rel))).sort();
    for (const name of names) {
      const childRel = rel === '' ? name : `${rel}/${name}`;
      const childTarget = target === '' ? name : `${target}/${name}`;
      const excluded = isIgnored(childRel, ignore);
      const info = await lstat(join(this.dir, childRel));
      if (info.isDirectory()) {
        if (excluded && !hasExceptions(ignore)) continue;
        if (!excluded) out.push(await this.entry(childRel, childTarget, fail));
        await this.walk(childRel, childTarget, out, ignore, fail);
        if (out.length > MAX_ENTRIES) return;
      } else if (!excluded) out.push(await this.entry(childRel, childTarget, fail));
    }
  }

  private async entry(rel: string, target: string, fail: (m: string) => never): Promise<ContextEntry> {
    const path = join(this.dir, rel);
    const info = await lstat(path);
    const base = { rel, target, mode: info.mode & 0o7777, size: info.size, mtimeMs: info.mtimeMs };
    if (info.isDirectory()) return { ...base, type: 'dir', size: 0 };
    if (info.isSymbolicLink()) return { ...base, type: 'symlink', linkTarget: await readlink(path) };
    if (!info.isFile()) fail(`"${rel}" in the build context is not a file, directory or symbolic link`);
    return { ...base, type: 'file', sha256: await sha256File(path) };
  }

  /** True when the file starts like a tar archive or a compressed stream (what Docker's ADD extracts). */
  async isArchive(rel: string): Promise<boolean> {
    const handle = await open(join(this.dir, rel), constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
    try {
      const head = Buffer.alloc(263);
      const { bytesRead } = await handle.read(head, 0, head.length, 0);
      const starts = (bytes: number[]) => bytes.every((b, i) => head[i] === b);
      return (
        starts([0x1f, 0x8b]) ||
        starts([0x42, 0x5a, 0x68]) ||
        starts([0xfd, 0x37, 0x7a, 0x58, 0x5a, 0x00]) ||
        starts([0x28, 0xb5, 0x2f, 0xfd]) ||
        (bytesRead >= 262 && head.subarray(257, 262).toString('latin1') === 'ustar')
      );
    } finally {
      await handle.close();
    }
  }

  /** Every path in the context (for wildcards), `.dockerignore` not yet applied. */
  private async allPaths(): Promise<string[]> {
    if (this.all) return this.all;
    const out: string[] = [];
    const visit = async (rel: string): Promise<void> => {
      for (const entry of await readdir(join(this.dir, rel), { withFileTypes: true })) {
        const child = rel === '' ? entry.name : `${rel}/${entry.name}`;
        out.push(child);
        if (out.length > MAX_ENTRIES) return;
        if (entry.isDirectory()) await visit(child);
      }
    };
    await visit('');
    this.all = out.sort();
    return this.all;
  }
}

export async function sha256File(path: string): Promise<string> {
  const hash = createHash('sha256');
  for await (const chunk of createReadStream(path, { flags: 'r' })) hash.update(chunk as Buffer);
  return hash.digest('hex');
}

function digestOf(entries: ContextEntry[]): string {
  const hash = createHash('sha256');
  const sorted = [...entries].sort((a, b) => (a.target < b.target ? -1 : a.target > b.target ? 1 : 0));
  for (const e of sorted) hash.update(`${JSON.stringify([e.target, e.type, e.mode, e.size, e.linkTarget ?? '', e.sha256 ?? ''])}\n`);
  return hash.digest('hex');
}
