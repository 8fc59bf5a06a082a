import { describe, expect, it } from 'vitest';
import { coalesce } from '../../src/server/route.js';

async function collect(stream: NodeJS.ReadableStream): Promise<string[]> {
  const chunks: string[] = [];
  for await (const chunk of stream) chunks.push(String(chunk));
  return chunks;
}

/** A promise the test opens by hand: the moment a line becomes ready is an event the test controls. */
function gate(): { opened: Promise<void>; open: () => void } {
  let open = (): void => undefined;
  const opened = new Promise<void>((resolve) => (open = resolve));
  return { opened, open };
}

describe('NDJSON coalescing', () => {
  it('joins lines that are ready together, in chunks no larger than the high-water mark', async () => {
    const line = `${'x'.repeat(99)}\n`;
    // A reattach to a chatty process: every stored line is ready at once.
    async function* backlog(): AsyncGenerator<string> {
      for (let i = 0; i < 10_000; i++) yield await Promise.resolve(line);
    }
    let waited = 0;
    const stream = coalesce(backlog(), () => waited++);
    const chunks = await collect(stream);
    expect(chunks.join('')).toBe(line.repeat(10_000));
    // Bounded chunks: a socket's backpressure (and the event loop) gets in between them.
    expect(chunks.length).toBeGreaterThan(10);
    for (const chunk of chunks) expect(chunk.length).toBeLessThanOrEqual(stream.readableHighWaterMark + line.length);
    expect(waited).toBe(0);
  });

  it('sends lines that come apart in time as separate chunks, and calls onWait once, when it first has to wait', async () => {
    // "Apart in time" is an explicit event, not a timer: the next line becomes ready only once the
    // stream has said it waits for it. A timer raced the stream's own setImmediate turn and lost
    // whenever the event loop was late (a busy machine), so onWait was never called.
    const later = gate();
    async function* slow(): AsyncGenerator<string> {
      yield 'a\n';
      yield 'b\n';
      await later.opened;
      yield 'c\n';
    }
    let waited = 0;
    const chunks = await collect(coalesce(slow(), () => (waited++, later.open())));
    expect(chunks).toEqual(['a\nb\n', 'c\n']);
    expect(waited).toBe(1);
    const first = gate();
    async function* quiet(): AsyncGenerator<string> {
      await first.opened;
      yield 'late\n';
    }
    let quietWaited = 0;
    const late = await collect(coalesce(quiet(), () => (quietWaited++, first.open())));
    expect(late).toEqual(['late\n']);
    expect(quietWaited).toBe(1);
  });
});
