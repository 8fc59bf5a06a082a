import { Readable } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { parseEntries } from '../../src/engine/files/entries.js';
import { parseWatchOutput } from '../../src/engine/files/watch.js';
import { frames } from '../../src/engine/files/write-stream.js';
import { isSandboxError } from '../../src/errors/index.js';

const record = (...fields: string[]): string => fields.map((field) => `${field}\0`).join('');

describe('parseEntries (find -printf output)', () => {
  it('reads files, directories, symlinks and names with newlines', () => {
    const out = Buffer.from(
      record('f', '5', '644', '1700000000.5000000000', '', '/workspace/a\nb') +
        record('d', '4096', '755', '1700000001.0', '', '/workspace/dir') +
        record('l', '1', '777', '1700000002.0', 'f', '/workspace/link') +
        record('p', '0', '4755', '1700000003.0', '', '/workspace/fifo'),
    );
    expect(parseEntries(out)).toEqual([
      { name: 'a\nb', path: '/workspace/a\nb', type: 'file', size: 5, mode: 0o644, modifiedAt: '2023-11-14T22:13:20.500Z' },
      { name: 'dir', path: '/workspace/dir', type: 'dir', size: 4096, mode: 0o755, modifiedAt: '2023-11-14T22:13:21.000Z' },
      { name: 'link', path: '/workspace/link', type: 'symlink', size: 1, mode: 0o777, modifiedAt: '2023-11-14T22:13:22.000Z', symlinkTarget: 'f' },
      { name: 'fifo', path: '/workspace/fifo', type: 'other', size: 0, mode: 0o4755, modifiedAt: '2023-11-14T22:13:23.000Z' },
    ]);
    expect(parseEntries(Buffer.from(record('d', '0', '755', '0', '', '/')))[0]?.name).toBe('/');
    expect(parseEntries(Buffer.alloc(0))).toEqual([]);
  });

  it('rejects forged or truncated output with an error, never a guess', () => {
    for (const bad of [
      record('f', '5', '644', '1.0', ''),
      record('f', 'x', '644', '1.0', '', '/a'),
      record('f', '5', '999', '1.0', '', '/a'),
      record('f', '5', '644', '1.0', '', 'relative'),
      record('f', '5', '644', '99999999999999999', '', '/a'),
      record('f', '5', '644', '', '', '/a'),
      'f\x005',
    ]) {
      let caught: unknown;
      try {
        parseEntries(Buffer.from(bad));
      } catch (error) {
        caught = error;
      }
      expect(isSandboxError(caught, 'INTERNAL'), JSON.stringify(bad)).toBe(true);
    }
  });
});

describe('parseWatchOutput (inotifywait %e\\0%w%f\\0)', () => {
  it('maps inotify events as fsnotify does and keeps a partial record for later', () => {
    const out = Buffer.from(
      'CREATE\0/workspace/a\0MODIFY\0/workspace/a\0ATTRIB\0/workspace/a\0MOVED_FROM\0/workspace/a\0' +
        'MOVED_TO\0/workspace/b\0CREATE,ISDIR\0/workspace/d\0DELETE_SELF\0/workspace/d/\0IGNORED\0/workspace/d/\0' +
        'CREATE\0/workspace/.capsule-upload-AbC12345\0DELETE\0/workspace/b\0MODI',
    );
    const { events, rest } = parseWatchOutput(out);
    expect(events).toEqual([
      { type: 'create', path: '/workspace/a' },
      { type: 'write', path: '/workspace/a' },
      { type: 'chmod', path: '/workspace/a' },
      { type: 'rename', path: '/workspace/a' },
      { type: 'create', path: '/workspace/b' },
      { type: 'create', path: '/workspace/d' },
      { type: 'remove', path: '/workspace/d' },
      { type: 'remove', path: '/workspace/b' },
    ]);
    expect(rest.toString()).toBe('MODI');
  });
});

describe('frames (write framing)', () => {
  const sizes = async (data: Readable | Buffer | string, size: number): Promise<number[]> => {
    const out: number[] = [];
    for await (const frame of frames(data, size)) out.push(frame.length);
    return out;
  };

  it('cuts buffers, strings and streams into frames of exactly the frame size', async () => {
    expect(await sizes(Buffer.alloc(10), 4)).toEqual([4, 4, 2]);
    expect(await sizes('', 4)).toEqual([]);
    expect(await sizes(Readable.from([Buffer.alloc(3), Buffer.alloc(3), 'ab', Buffer.alloc(9)]), 4)).toEqual([4, 4, 4, 4, 1]);
    const joined: Buffer[] = [];
    for await (const frame of frames(Readable.from(['hel', 'lo ', 'world']), 4)) joined.push(frame);
    expect(Buffer.concat(joined).toString()).toBe('hello world');
  });
});
