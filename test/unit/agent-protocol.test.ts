import { describe, it, expect } from 'vitest';
import { isSandboxError } from '../../src/errors/index.js';
import {
  FrameDecoder,
  FrameType,
  HEADER_BYTES,
  MAX_PAYLOAD_BYTES,
  decodeExit,
  decodeStartFailed,
  decodeStarted,
  encodeFrame,
  encodeResize,
  encodeSignal,
  encodeStart,
} from '../../src/backends/agent/protocol.js';

function thrown(fn: () => unknown): unknown {
  try {
    fn();
  } catch (error) {
    return error;
  }
  throw new Error('expected a throw');
}

/** Splits a START payload back into [tag, value] records. */
function records(payload: Buffer): [string, Buffer][] {
  const out: [string, Buffer][] = [];
  for (let offset = 0; offset < payload.length; ) {
    const length = payload.readUInt32BE(offset + 1);
    out.push([String.fromCharCode(payload.readUInt8(offset)), payload.subarray(offset + 5, offset + 5 + length)]);
    offset += 5 + length;
  }
  return out;
}

describe('frame codec', () => {
  it('encodes the header big-endian', () => {
    const frame = encodeFrame(FrameType.Input, 0x01020304, Buffer.from('hi'));
    expect([...frame]).toEqual([0x49, 1, 2, 3, 4, 0, 0, 0, 2, 0x68, 0x69]);
  });

  it('round-trips frames of every size, several per chunk', () => {
    const sent = [
      { type: FrameType.Ready, id: 0, payload: Buffer.alloc(0) },
      { type: FrameType.Stdout, id: 7, payload: Buffer.from('hello') },
      { type: FrameType.Stderr, id: 0xffffffff, payload: Buffer.alloc(MAX_PAYLOAD_BYTES, 0xab) },
    ];
    const wire = Buffer.concat(sent.map((f) => encodeFrame(f.type, f.id, f.payload)));
    const got = new FrameDecoder().push(wire);
    expect(got.map((f) => [f.type, f.id, f.payload.length])).toEqual(sent.map((f) => [f.type, f.id, f.payload.length]));
    got.forEach((frame, i) => expect(frame.payload.equals(sent[i]?.payload ?? Buffer.alloc(0))).toBe(true));
  });

  it('reassembles frames delivered one byte at a time', () => {
    const wire = Buffer.concat([
      encodeFrame(FrameType.Stdout, 1, Buffer.from('abc')),
      encodeFrame(FrameType.Exit, 1, Buffer.from([0, 0, 0, 0, 3])),
    ]);
    const decoder = new FrameDecoder();
    const got = [];
    for (const byte of wire) {
      got.push(...decoder.push(Buffer.from([byte])));
    }
    expect(got.map((f) => [f.type, f.id, f.payload.toString('hex')])).toEqual([
      [FrameType.Stdout, 1, Buffer.from('abc').toString('hex')],
      [FrameType.Exit, 1, '0000000003'],
    ]);
    expect(decoder.pendingBytes).toBe(0);
  });

  it('keeps a partial frame until the rest arrives', () => {
    const wire = encodeFrame(FrameType.Stdout, 2, Buffer.from('0123456789'));
    const decoder = new FrameDecoder();
    expect(decoder.push(wire.subarray(0, 4))).toEqual([]);
    expect(decoder.push(wire.subarray(4, HEADER_BYTES + 3))).toEqual([]);
    expect(decoder.pendingBytes).toBe(HEADER_BYTES + 3);
    const [frame] = decoder.push(wire.subarray(HEADER_BYTES + 3));
    expect(frame?.payload.toString()).toBe('0123456789');
  });

  it('rejects an oversized frame from the header alone', () => {
    const header = Buffer.alloc(HEADER_BYTES);
    header.writeUInt8(FrameType.Stdout, 0);
    header.writeUInt32BE(MAX_PAYLOAD_BYTES + 1, 5);
    const error = thrown(() => new FrameDecoder().push(header));
    expect(isSandboxError(error, 'INTERNAL')).toBe(true);
  });

  it('refuses to encode an oversized payload', () => {
    const error = thrown(() => encodeFrame(FrameType.Input, 1, Buffer.alloc(MAX_PAYLOAD_BYTES + 1)));
    expect(isSandboxError(error, 'INVALID_ARGUMENT')).toBe(true);
  });
});

describe('START payload', () => {
  it('encodes argv in order, env as K=V, cwd, stdin mode and pty size', () => {
    const payload = encodeStart({
      argv: ['sh', '-c', 'echo hi'],
      env: { PATH: '/bin', A: 'x=y' },
      cwd: '/work',
      stdin: true,
      pty: { cols: 80, rows: 24 },
    });
    expect(records(payload).map(([tag, value]) => [tag, tag === 't' || tag === 'i' ? [...value] : value.toString()])).toEqual([
      ['a', 'sh'],
      ['a', '-c'],
      ['a', 'echo hi'],
      ['e', 'PATH=/bin'],
      ['e', 'A=x=y'],
      ['c', '/work'],
      ['i', [1]],
      ['t', [0, 80, 0, 24]],
    ]);
  });

  it('defaults stdin to /dev/null and omits the pty', () => {
    const tags = records(encodeStart({ argv: ['true'], env: {}, cwd: '/' }));
    expect(tags.map(([tag]) => tag)).toEqual(['a', 'c', 'i']);
    expect([...(tags[2]?.[1] ?? [])]).toEqual([0]);
  });

  it.each([
    ['empty argv', { argv: [], env: {}, cwd: '/' }],
    ['NUL in argv', { argv: ['a\0b'], env: {}, cwd: '/' }],
    ['NUL in env value', { argv: ['a'], env: { K: 'v\0' }, cwd: '/' }],
    ['= in env name', { argv: ['a'], env: { 'K=': 'v' }, cwd: '/' }],
    ['relative cwd', { argv: ['a'], env: {}, cwd: 'work' }],
    ['NUL in cwd', { argv: ['a'], env: {}, cwd: '/w\0' }],
    ['zero pty cols', { argv: ['a'], env: {}, cwd: '/', pty: { cols: 0, rows: 24 } }],
  ])('rejects %s with INVALID_ARGUMENT', (_name, options) => {
    expect(isSandboxError(thrown(() => encodeStart(options)), 'INVALID_ARGUMENT')).toBe(true);
  });
});

describe('small payloads', () => {
  it('encodes resize and signal', () => {
    expect([...encodeResize(132, 43)]).toEqual([0, 132, 0, 43]);
    expect([...encodeSignal(15)]).toEqual([15]);
    expect(isSandboxError(thrown(() => encodeSignal(0)), 'INVALID_ARGUMENT')).toBe(true);
  });

  it('decodes STARTED, START_FAILED and EXIT', () => {
    expect(decodeStarted(Buffer.from([0, 0, 0x30, 0x39]))).toEqual({ pid: 12345 });
    const failed = Buffer.concat([Buffer.from([0, 0, 0, 2]), Buffer.from('exec /nope: No such file or directory')]);
    expect(decodeStartFailed(failed)).toEqual({ errno: 2, message: 'exec /nope: No such file or directory' });
    expect(decodeExit(Buffer.from([0, 0, 0, 0, 3]))).toEqual({ kind: 'exited', value: 3 });
    expect(decodeExit(Buffer.from([1, 0, 0, 0, 9]))).toEqual({ kind: 'signaled', value: 9 });
    expect(isSandboxError(thrown(() => decodeExit(Buffer.from([1]))), 'INTERNAL')).toBe(true);
  });
});
