import { getEventListeners } from 'node:events';
import { describe, expect, it } from 'vitest';
import { ManagedProcess } from '../../src/engine/managed-process.js';
import type { ExecResult } from '../../src/wire/index.js';
import type { ProcessEvent } from '../../src/engine/types.js';

function process(): { managed: ManagedProcess; finish: (result: ExecResult) => void } {
  let finish: (result: ExecResult) => void = () => undefined;
  const result = new Promise<ExecResult>((resolve) => (finish = resolve));
  const managed = new ManagedProcess({ argv: ['x'], cwd: '/workspace', startedAt: new Date(0).toISOString() }, { stdoutBytes: 1024, stderrBytes: 1024 }, result);
  return { managed, finish };
}

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
    expect(seen).toHaveLength(50);
    expect(getEventListeners(controller.signal, 'abort')).toHaveLength(0);
  });

  it('replays the whole log to a late reader and ends with the exit', async () => {
    const { managed, finish } = process();
    managed.output('stdout', Buffer.from('a'));
    managed.output('stderr', Buffer.from('b'));
    finish({ outcome: 'ok' } as ExecResult);
    await managed.result;
    const types: string[] = [];
    for await (const event of managed.events()) types.push(event.type);
    expect(types).toEqual(['stdout', 'stderr', 'exit']);
  });
});
