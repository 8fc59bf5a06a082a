import { Readable } from 'node:stream';

/**
 * A minimal POSIX tar (ustar with pax extended headers for long or non-ASCII names and link
 * targets) for exporting a sandbox's changes and applying a fork's changes to its parent. Written
 * here rather than spawned: the bytes come from read-only snapshots the host reads safely, and the
 * archive only ever holds what the caller lists.
 */
export interface TarEntry {
  /** Relative path, `/`-separated, no leading `/`. */
  name: string;
  type: 'file' | 'dir' | 'symlink';
  mode: number;
  /** Bytes of a file's body; 0 for the rest. */
  size: number;
  mtimeMs?: number;
  uid?: number;
  gid?: number;
  /** A symlink's target. */
  linkname?: string;
  /** A file's content, exactly `size` bytes (opened lazily, when the entry is written). */
  body?: () => Promise<Readable | undefined>;
}

const BLOCK = 512;

function octal(value: number, width: number): string {
  return `${value.toString(8).padStart(width - 1, '0')}\0`;
}

function fitsUstar(text: string, max: number): boolean {
  return Buffer.byteLength(text) <= max && /^[\x20-\x7e]*$/.test(text);
}

/** A pax record: "<len> key=value\n" where len counts the whole record, itself included. */
function paxRecord(key: string, value: string): string {
  const body = ` ${key}=${value}\n`;
  let length = Buffer.byteLength(body) + 1;
  while (String(length).length + Buffer.byteLength(body) !== length) length = String(length).length + Buffer.byteLength(body);
  return `${length}${body}`;
}

function header(fields: { name: string; mode: number; uid: number; gid: number; size: number; mtime: number; typeflag: string; linkname: string }): Buffer {
  const block = Buffer.alloc(BLOCK);
  block.write(fields.name, 0, 100, 'utf8');
  block.write(octal(fields.mode & 0o7777, 8), 100, 'ascii');
  block.write(octal(Math.min(fields.uid, 0o7777777), 8), 108, 'ascii');
  block.write(octal(Math.min(fields.gid, 0o7777777), 8), 116, 'ascii');
  block.write(octal(fields.size, 12), 124, 'ascii');
  block.write(octal(fields.mtime, 12), 136, 'ascii');
  block.write('        ', 148, 'ascii');
  block.write(fields.typeflag, 156, 'ascii');
  block.write(fields.linkname, 157, 100, 'utf8');
  block.write('ustar\x0000', 257, 'ascii');
  let sum = 0;
  for (const byte of block) sum += byte;
  block.write(`${sum.toString(8).padStart(6, '0')}\0 `, 148, 'ascii');
  return block;
}

function padding(size: number): Buffer {
  const rest = size % BLOCK;
  return Buffer.alloc(rest === 0 ? 0 : BLOCK - rest);
}

/** The header blocks of one entry (a pax header first when ustar cannot hold its name or link). */
export function entryHeader(entry: TarEntry): Buffer {
  const name = entry.type === 'dir' && !entry.name.endsWith('/') ? `${entry.name}/` : entry.name;
  const linkname = entry.linkname ?? '';
  const mtime = Math.floor((entry.mtimeMs ?? 0) / 1000);
  const common = { mode: entry.mode, uid: entry.uid ?? 0, gid: entry.gid ?? 0, mtime };
  const typeflag = entry.type === 'file' ? '0' : entry.type === 'dir' ? '5' : '2';
  const size = entry.type === 'file' ? entry.size : 0;
  const pax: string[] = [];
  if (!fitsUstar(name, 100)) pax.push(paxRecord('path', name));
  if (!fitsUstar(linkname, 100)) pax.push(paxRecord('linkpath', linkname));
  if (size > 0o77777777777) pax.push(paxRecord('size', String(size)));
  if ((entry.uid ?? 0) > 0o7777777) pax.push(paxRecord('uid', String(entry.uid)));
  if ((entry.gid ?? 0) > 0o7777777) pax.push(paxRecord('gid', String(entry.gid)));
  const main = header({
    ...common,
    name: fitsUstar(name, 100) ? name : 'capsule-long-name',
    size: size > 0o77777777777 ? 0 : size,
    typeflag,
    linkname: fitsUstar(linkname, 100) ? linkname : '',
  });
  if (pax.length === 0) return main;
  const body = Buffer.from(pax.join(''), 'utf8');
  return Buffer.concat([header({ ...common, name: 'PaxHeader', size: body.length, typeflag: 'x', linkname: '' }), body, padding(body.length), main]);
}

/** The archive of `entries`, in order, as a stream; a body shorter or longer than its size is an error. */
export function tarStream(entries: AsyncIterable<TarEntry> | Iterable<TarEntry>): Readable {
  async function* blocks(): AsyncGenerator<Buffer> {
    for await (const entry of entries) {
      const body = entry.type === 'file' ? await entry.body?.() : undefined;
      if (entry.type === 'file' && body === undefined && entry.size > 0) continue; // gone since it was listed
      yield entryHeader(entry);
      if (entry.type !== 'file') continue;
      let written = 0;
      for await (const chunk of body ?? []) {
        const buffer = chunk as Buffer;
        const room = entry.size - written;
        if (room <= 0) break;
        const part = buffer.length > room ? buffer.subarray(0, room) : buffer;
        written += part.length;
        yield part;
      }
      if (written < entry.size) throw new Error(`${entry.name} ended after ${written} of its ${entry.size} bytes`);
      yield padding(entry.size);
    }
    yield Buffer.alloc(BLOCK * 2);
  }
  return Readable.from(blocks(), { objectMode: false });
}
