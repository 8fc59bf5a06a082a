import { describe, expect, it } from 'vitest';
import { isSandboxError } from '../../src/errors/index.js';
import { MAX_LABEL_BYTES, decodeDropped, decodeListReply, encodeStart } from '../../src/backends/agent/protocol.js';

/** One LIST_REPLY record as native/capsule-agent.c writes it. */
function listRecord(state: number, id: number, pid: number, flags: number, kind: number, value: number, label: string): Buffer {
  const head = Buffer.alloc(19);
  head.writeUInt8(state, 0);
  head.writeUInt32BE(id, 1);
  head.writeUInt32BE(pid, 5);
  head.writeUInt8(flags, 9);
  head.writeUInt8(kind, 10);
  head.writeUInt32BE(value, 11);
  head.writeUInt32BE(Buffer.byteLength(label), 15);
  return Buffer.concat([head, Buffer.from(label)]);
}

describe('agent LIST and labels (reattach after a server restart)', () => {
  it('decodes running and ended processes with their labels', () => {
    const payload = Buffer.concat([Buffer.from([1]), listRecord(0, 4, 17, 3, 0, 0, '{"argv":["sh"]}'), listRecord(1, 2, 9, 0, 1, 9, '')]);
    expect(decodeListReply(payload)).toEqual({
      more: true,
      processes: [
        { id: 4, pid: 17, isPty: true, hasStdin: true, label: '{"argv":["sh"]}' },
        { id: 2, pid: 9, isPty: false, hasStdin: false, exit: { kind: 'signaled', value: 9 }, label: '' },
      ],
    });
    expect(decodeListReply(Buffer.from([0]))).toEqual({ more: false, processes: [] });
  });

  it('refuses a truncated record as a broken agent', () => {
    const record = listRecord(0, 1, 2, 0, 0, 0, 'abc');
    expect(isSandboxError(thrown(() => decodeListReply(Buffer.concat([Buffer.from([0]), record.subarray(0, 20)]))), 'INTERNAL')).toBe(true);
    expect(isSandboxError(thrown(() => decodeDropped(Buffer.alloc(4))), 'INTERNAL')).toBe(true);
    expect(decodeDropped(Buffer.from([0, 0, 0, 0, 0, 1, 0, 0]))).toBe(65536);
  });

  it("carries a label as START's 'l' record, and leaves off one the agent would refuse", () => {
    const base = { argv: ['true'], env: {}, cwd: '/' };
    const withLabel = encodeStart({ ...base, label: 'tagged' });
    expect(withLabel.subarray(-11).toString('latin1')).toBe('l\0\0\0\x06tagged');
    expect(encodeStart({ ...base, label: 'x'.repeat(MAX_LABEL_BYTES + 1) })).toEqual(encodeStart(base));
  });
});

function thrown(fn: () => unknown): unknown {
  try {
    fn();
  } catch (error) {
    return error;
  }
  return undefined;
}
