import { getEventListeners } from 'node:events';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AgentProcess } from '../../src/backends/agent/index.js';
import { ManagedProcess } from '../../src/engine/managed-process.js';
import type { ExecResult } from '../../src/wire/index.js';
import { ProcessOutput } from '../../src/engine/process-output.js';
import { RESULT_INLINE_BYTES } from '../../src/engine/result.js';
import type { ProcessEvent } from '../../src/engine/types.js';

// Made in a hook: collecting the tests (`vitest list`) runs none, and would leave the directory.
let dir: string;
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'capsule-managed-process-'));
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));
let next = 0;

const agent = { pid: 42 } as AgentProcess;

function process(caps = { stdoutBytes: 1024, stderrBytes: 1024 }): { managed: ManagedProcess; log: ProcessOutput; finish: (result: ExecResult) => Promise<void> } {
  let settle: (result: ExecResult) => void = () => undefined;
  const result = new Promise<ExecResult>((resolve) => (settle = resolve));
  const managed = new ManagedProcess({ argv: ['x'], cwd: '/workspace', startedAt: new Date(0).toISOString() }, caps, result);
  const log = new ProcessOutput({ path: join(dir, `${next++}.ndjson`), ensureDir: () => Promise.resolve() });
  managed.started(agent, log);
  const finish = async (r: ExecResult): Promise<void> => {
    settle(r);
    await managed.ended;
    await log.close();
  };
  return { managed, log, finish };
}

const ok = { outcome: 'ok', stdout: '', stderr: '', stdoutBytes: 0, stderrBytes: 0, warnings: [] } as unknown as ExecResult;

async function collect(events: AsyncIterable<ProcessEvent>): Promise<ProcessEvent[]> {
  const all: ProcessEvent[] = [];
  for await (const event of events) all.push(event);
  return all;
}

const text = (events: ProcessEvent[], stream: 'stdout' | 'stderr'): string =>
  Buffer.concat(events.flatMap((e) => (e.type === stream ? [e.data] : []))).toString();

describe('ManagedProcess events', () => {
  it('keeps at most one abort listener on the reader signal however many events it waits for', async () => {
    const { managed } = process();
    const controller = new AbortController();
    const seen: ProcessEvent[] = [];
    const reading = (async () => {
      for await (const event of managed.events(controller.signal)) seen.push(event);
    })();
    for (let i = 0; i < 50; i++) {
      managed.output('stdout', Buffer.from(`${i}\n`));
      await new Promise((resolve) => setImmediate(resolve));
      expect(getEventListeners(controller.signal, 'abort').length).toBeLessThanOrEqual(1);
    }
    controller.abort();
    await reading;
    expect(seen.filter((e) => e.type === 'stdout')).toHaveLength(50);
    expect(getEventListeners(controller.signal, 'abort')).toHaveLength(0);
  });

  it('replays the whole story to a late reader from the log on disk, warnings in place, and ends with the exit', async () => {
    const { managed, log, finish } = process();
    managed.output('stdout', Buffer.from('a'));
    managed.warn({ resource: 'memory', limit: 1, used: 1, message: 'near the limit' });
    managed.output('stderr', Buffer.from('b'));
    await finish(ok);
    expect(log.position).toBe(2);
    const events = await collect(managed.events());
    expect(events.map((e) => e.type)).toEqual(['start', 'stdout', 'warning', 'stderr', 'exit']);
    const exit = events.at(-1);
    expect(exit?.type === 'exit' && exit.result).toMatchObject({ stdout: 'a', stderr: 'b', stdoutBytes: 1, stdoutTruncated: false });
  });

  it('replays only what the caps keep, and flags the rest', async () => {
    const { managed, finish } = process({ stdoutBytes: 4, stderrBytes: 1024 });
    managed.output('stdout', Buffer.from('12'));
    managed.output('stderr', Buffer.from('e1'));
    managed.output('stdout', Buffer.from('3456'));
    managed.output('stderr', Buffer.from('e2'));
    await finish(ok);
    const events = await collect(managed.events());
    expect(text(events, 'stdout')).toBe('1234');
    expect(text(events, 'stderr')).toBe('e1e2');
    expect(await managed.result).toMatchObject({ stdout: '1234', stderr: 'e1e2', stdoutBytes: 6, stdoutTruncated: true, stderrTruncated: false });
  });

  it('carries at most 1 MiB of a stream inline in the result, and says so', async () => {
    const { managed, finish } = process({ stdoutBytes: 3 * RESULT_INLINE_BYTES, stderrBytes: 1024 });
    const block = Buffer.alloc(64 * 1024, 'x');
    for (let i = 0; i < 40; i++) managed.output('stdout', block);
    await finish(ok);
    const result = await managed.result;
    expect(Buffer.byteLength(result.stdout)).toBe(RESULT_INLINE_BYTES);
    expect(result).toMatchObject({ stdoutInlineTruncated: true, stdoutTruncated: false, stdoutBytes: 40 * block.length });
    expect(result.stderrInlineTruncated).toBeUndefined();
    const events = await collect(managed.events());
    expect(text(events, 'stdout').length).toBe(40 * block.length);
  });
});
