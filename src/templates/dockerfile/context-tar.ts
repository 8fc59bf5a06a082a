import { constants } from 'node:fs';
import { mkdir, open, symlink } from 'node:fs/promises';
import { join, posix } from 'node:path';
import { Readable } from 'node:stream';
import { createGunzip } from 'node:zlib';
import { SandboxError } from '../../errors/index.js';

/** Bounds of one archive unpacked into a build context. */
export interface ContextTarLimits {
  /** Bytes of file content in all. @default 2 GiB */
  maxBytes?: number;
  /** Entries in all. @default 200 000 (what one COPY may select) */
  maxEntries?: number;
}

const BLOCK = 512;
const DEFAULT_MAX_BYTES = 2 * 1024 ** 3;
const DEFAULT_MAX_ENTRIES = 200_000;
const MAX_HEADER_TEXT = 64 * 1024;

/** Exactly-n-bytes reads over a stream's chunks. */
class ByteReader {
  private buffered: Buffer[] = [];
  private length = 0;
  private readonly chunks: AsyncIterator<Buffer>;
  private ended = false;

  constructor(stream: AsyncIterable<Buffer>) {
    this.chunks = stream[Symbol.asyncIterator]();
  }

  private async fill(n: number): Promise<boolean> {
    while (this.length < n && !this.ended) {
      const next = await this.chunks.next();
      if (next.done) this.ended = true;
      else {
        this.buffered.push(next.value);
        this.length += next.value.length;
      }
    }
    return this.length >= n;
  }

  private take(n: number): Buffer {
    const all = this.buffered.length === 1 ? this.buffered[0]! : Buffer.concat(this.buffered);
    this.buffered = all.length > n ? [all.subarray(n)] : [];
    this.length = all.length - n;
    return all.subarray(0, n);
  }

  /** n bytes, or undefined at the end of the stream (a truncated read is an error). */
  async read(n: number): Promise<Buffer | undefined> {
    if (!(await this.fill(n))) {
      if (this.length === 0) return undefined;
      throw bad('the archive ends in the middle of an entry');
    }
    return this.take(n);
  }

  /** n bytes passed to `sink` as they come, without holding them all. */
  async pipe(n: number, sink: (chunk: Buffer) => Promise<void>): Promise<void> {
    let left = n;
    while (left > 0) {
      if (!(await this.fill(1))) throw bad('the archive ends in the middle of a file');
      const chunk = this.take(Math.min(left, this.length));
      left -= chunk.length;
      await sink(chunk);
    }
  }
}

function bad(message: string): SandboxError {
  return new SandboxError('INVALID_ARGUMENT', `the uploaded files are not a tar archive Capsule accepts: ${message}`, {
    hint: 'Upload a tar (optionally gzipped) of regular files, directories and symbolic links with relative paths, as the E2B SDK makes.',
  });
}

function text(block: Buffer, start: number, length: number): string {
  const field = block.subarray(start, start + length);
  const end = field.indexOf(0);
  return field.subarray(0, end < 0 ? length : end).toString('utf8');
}

function number(block: Buffer, start: number, length: number): number {
  const field = block.subarray(start, start + length);
  // Base-256 (GNU) for sizes past 8 GiB: never needed within the limits, refused.
  if ((field[0]! & 0x80) !== 0) throw bad('a size in base-256 is past the limits');
  const digits = text(block, start, length).trim();
  if (digits === '') return 0;
  if (!/^[0-7]+$/.test(digits)) throw bad(`"${digits}" is not an octal number`);
  return parseInt(digits, 8);
}

function checksumOk(block: Buffer): boolean {
  let sum = 0;
  for (let i = 0; i < BLOCK; i++) sum += i >= 148 && i < 156 ? 32 : block[i]!;
  const stored = text(block, 148, 8).trim();
  return /^[0-7]+$/.test(stored) && sum === parseInt(stored, 8);
}

/** Pax records `LEN key=value\n`: the keys Capsule uses (path, linkpath, size). */
function paxRecords(data: string): Record<string, string> {
  const out: Record<string, string> = {};
  let rest = data;
  while (rest.length > 0) {
    const space = rest.indexOf(' ');
    const length = Number(rest.slice(0, space));
    if (space <= 0 || !Number.isInteger(length) || length <= space) throw bad('a pax header is malformed');
    const record = Buffer.from(rest, 'utf8').subarray(0, length).toString('utf8');
    const eq = record.indexOf('=');
    if (eq < 0) throw bad('a pax record has no "="');
    out[record.slice(space + 1, eq)] = record.slice(eq + 1).replace(/\n$/, '');
    rest = Buffer.from(rest, 'utf8').subarray(length).toString('utf8');
  }
  return out;
}

/** A member's path as a relative path inside the context, or an error naming why not. */
function contextPath(name: string): string {
  const trimmed = name.replace(/^(\.\/)+/, '').replace(/\/+$/, '');
  if (trimmed === '' || trimmed === '.') return '';
  if (trimmed.startsWith('/')) throw bad(`"${name}" is an absolute path`);
  const parts = trimmed.split('/');
  if (parts.includes('..')) throw bad(`"${name}" leaves the archive's directory`);
  return posix.normalize(trimmed);
}

/**
 * Unpacks a tar (gzipped or not) into `root`, a fresh directory of the caller's, as a build
 * context: regular files, directories and symbolic links only, every path relative and inside,
 * none written through a link (a link is never followed; a path under one is refused), none twice,
 * permissions kept to 0777 and owners not kept. Past the limits it stops with PAYLOAD_TOO_LARGE.
 */
export async function unpackContextTar(input: Readable, root: string, limits: ContextTarLimits = {}): Promise<{ entries: number; bytes: number }> {
  try {
    return await unpack(input, root, limits);
  } catch (error) {
    // A path made twice over, or through a file: the archive's fault, said as such.
    const code = (error as NodeJS.ErrnoException).code;
    if (code === 'EEXIST' || code === 'ENOTDIR' || code === 'ENAMETOOLONG' || code === 'Z_DATA_ERROR') throw bad((error as Error).message);
    throw error;
  }
}

async function unpack(input: Readable, root: string, limits: ContextTarLimits): Promise<{ entries: number; bytes: number }> {
  const maxBytes = limits.maxBytes ?? DEFAULT_MAX_BYTES;
  const maxEntries = limits.maxEntries ?? DEFAULT_MAX_ENTRIES;
  const reader = new ByteReader(await maybeGunzip(input));
  const links = new Set<string>();
  let entries = 0;
  let bytes = 0;
  let pax: Record<string, string> = {};
  let longName: string | undefined;
  let longLink: string | undefined;
  for (;;) {
    const block = await reader.read(BLOCK);
    if (block === undefined || block.every((b) => b === 0)) break;
    if (!checksumOk(block)) throw bad('a header checksum is wrong');
    const type = String.fromCharCode(block[156]!);
    if (type === 'x' || type === 'g' || type === 'L' || type === 'K') {
      const length = number(block, 124, 12);
      if (length > MAX_HEADER_TEXT) throw bad('an extended header is too long');
      const data = (await reader.read(Math.ceil(length / BLOCK) * BLOCK)) ?? Buffer.alloc(0);
      const value = data.subarray(0, length).toString('utf8');
      if (type === 'x') pax = paxRecords(value);
      else if (type === 'L') longName = value.replace(/\0+$/, '');
      else if (type === 'K') longLink = value.replace(/\0+$/, '');
      continue;
    }
    const prefix = text(block, 345, 155);
    const name = pax.path ?? longName ?? (prefix ? `${prefix}/${text(block, 0, 100)}` : text(block, 0, 100));
    const linkName = pax.linkpath ?? longLink ?? text(block, 157, 100);
    const size = pax.size !== undefined ? Number(pax.size) : number(block, 124, 12);
    if (!Number.isSafeInteger(size) || size < 0) throw bad(`"${name}" has a bad size`);
    const padded = Math.ceil(size / BLOCK) * BLOCK;
    pax = {};
    longName = longLink = undefined;
    if (++entries > maxEntries) throw tooLarge(`more than ${maxEntries} entries`);
    const rel = contextPath(name);
    for (let parent = posix.dirname(rel); parent !== '.' && parent !== ''; parent = posix.dirname(parent)) {
      if (links.has(parent)) throw bad(`"${name}" is under the symbolic link "${parent}"`);
    }
    const target = join(root, rel);
    const mode = number(block, 100, 8) & 0o777;
    if (type === '5') {
      await mkdir(target, { recursive: true, mode: mode | 0o700 });
    } else if (type === '0' || type === '\0' || type === '7') {
      if (rel === '') throw bad('a file has no name');
      bytes += size;
      if (bytes > maxBytes) throw tooLarge(`more than ${maxBytes} bytes of files`);
      await mkdir(join(root, posix.dirname(rel)), { recursive: true, mode: 0o755 });
      const handle = await open(target, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, mode).catch((error: NodeJS.ErrnoException) => {
        throw error.code === 'EEXIST' ? bad(`"${name}" is in the archive twice`) : error;
      });
      try {
        await reader.pipe(size, async (chunk) => void (await handle.write(chunk)));
        await handle.chmod(mode);
      } finally {
        await handle.close();
      }
      await reader.read(padded - size);
      continue;
    } else if (type === '2') {
      if (rel === '') throw bad('a symbolic link has no name');
      await mkdir(join(root, posix.dirname(rel)), { recursive: true, mode: 0o755 });
      await symlink(linkName, target).catch((error: NodeJS.ErrnoException) => {
        throw error.code === 'EEXIST' ? bad(`"${name}" is in the archive twice`) : error;
      });
      links.add(rel);
    } else {
      throw bad(`"${name}" is a ${type === '1' ? 'hard link' : 'device, fifo or other special file'}: only files, directories and symbolic links are accepted`);
    }
    if (padded > 0) await reader.read(padded);
  }
  return { entries, bytes };
}

function tooLarge(what: string): SandboxError {
  return new SandboxError('PAYLOAD_TOO_LARGE', `the uploaded files unpack to ${what}`, {
    hint: 'Copy less into the template (a .dockerignore next to the template file leaves files out), or fetch big files in a RUN step.',
  });
}

/** The stream, gunzipped when it starts with gzip's magic bytes. */
async function maybeGunzip(input: Readable): Promise<AsyncIterable<Buffer>> {
  const iterator = input[Symbol.asyncIterator]() as AsyncIterator<Buffer>;
  const first = await iterator.next();
  const head: Buffer | undefined = first.done ? undefined : first.value;
  async function* replay(): AsyncGenerator<Buffer> {
    if (head) yield head;
    for (;;) {
      const next = await iterator.next();
      if (next.done) return;
      yield next.value;
    }
  }
  if (head && head[0] === 0x1f && head[1] === 0x8b) return Readable.from(replay()).pipe(createGunzip());
  return replay();
}
