import { describe, expect, it } from 'vitest';
import { ExecutionBuilder, LineDecoder, parseEvent } from '../../src/engine/interpreter/protocol.js';
import { driverArgv } from '../../src/engine/interpreter/driver.js';
import { memoryLimit, timeoutLimit } from '../../src/engine/interpreter/limits.js';
import type { CodeResult } from '../../src/wire/index.js';

describe('interpreter driver protocol', () => {
  it('splits lines across chunks, including a multi-byte character cut in two', () => {
    const decoder = new LineDecoder();
    const bytes = Buffer.from('{"a":"é"}\n{"b":1}\n');
    expect(decoder.push(bytes.subarray(0, 8))).toEqual([]);
    expect(decoder.push(bytes.subarray(8, 12))).toEqual(['{"a":"é"}']);
    expect(decoder.push(bytes.subarray(12))).toEqual(['{"b":1}']);
  });

  it('parses known events and maps MIME fields; rejects unknown ones', () => {
    expect(parseEvent('{"type":"ready"}')).toEqual({ type: 'ready' });
    expect(parseEvent('{"id":"3","type":"result","isMainResult":true,"text":"1","png":"iVBOR","json":{"a":1},"bogus":5}')).toEqual({
      type: 'result', id: '3', isMainResult: true, text: '1', png: 'iVBOR', json: { a: 1 },
    });
    expect(parseEvent('{"id":"3","type":"error","name":"E","value":{"x":1}}')).toEqual({ type: 'error', id: '3', name: 'E', value: '', traceback: '' });
    expect(parseEvent('{"id":"3","type":"end","outcome":"weird"}')).toEqual({ type: 'end', id: '3', outcome: 'idle' });
    expect(() => parseEvent('{"type":"nope"}')).toThrow(/unknown driver event type/);
    expect(() => parseEvent('[1]')).toThrow(/not a driver event/);
  });

  it('folds events into an Execution, capping output and flagging truncation', () => {
    const seen: CodeResult[] = [];
    const builder = new ExecutionBuilder('py-1', { stdoutBytes: 5, stderrBytes: 100 }, { onResult: (r) => seen.push(r) });
    builder.apply({ type: 'executionCount', id: '1', count: 4 });
    builder.apply({ type: 'stdout', id: '1', text: 'abc' });
    builder.apply({ type: 'stdout', id: '1', text: 'defgh' });
    builder.apply({ type: 'stdout', id: '1', text: 'ijk' });
    builder.apply({ type: 'result', id: '1', isMainResult: true, text: '2' });
    builder.apply({ type: 'error', id: '1', name: 'E', value: 'v', traceback: 't' });
    expect(builder.execution).toEqual({
      contextId: 'py-1',
      executionCount: 4,
      stdout: ['abc', 'de'],
      stdoutTruncated: true,
      stderr: [],
      results: [{ isMainResult: true, text: '2' }],
      error: { name: 'E', value: 'v', traceback: 't' },
    });
    expect(seen).toEqual([{ isMainResult: true, text: '2' }]);
  });

  it('starts drivers from the read-only tools directory', () => {
    expect(driverArgv('python', 'py-1', '/workspace')).toEqual(['python3', '/.capsule/python_driver.py', '--context', 'py-1', '--cwd', '/workspace']);
    const js = driverArgv('ts', 'ts-1', '/tmp');
    expect([js[0], js[1], ...js.slice(3)]).toEqual(['python3', '-c', '--context', 'ts-1']);
    expect(js[2]).toContain('os.setpgid(0, 0)');
    expect(js[2]).toContain('"/.capsule/js_driver.mjs"');
  });

  it('names the context, the limit and what to do in limit messages', () => {
    expect(timeoutLimit('py-1', 1000, 1200, false).message).toBe(
      'wall-clock limit 1 s exceeded (ran 1.2 s); the code was interrupted; context py-1 keeps the state it had before this call. ' +
        'Pass a larger timeoutMs (--timeout) or make the code finish sooner.',
    );
    expect(timeoutLimit('js-1', 500, 2600, true).message).toContain('context js-1 was restarted and its state (variables, imports) is lost');
    const memory = memoryLimit('py-2', 'python', 256 * 1024 * 1024, 256 * 1024 * 1024);
    expect(memory).toMatchObject({ resource: 'memory', limit: 268435456, unit: 'bytes' });
    expect(memory.message).toMatch(/^memory limit 256 MiB exceeded \(peak 256 MiB\); the OOM killer ended the python interpreter of context py-2/);
    expect(memory.message).toContain('restartContext("py-2")');
  });
});
