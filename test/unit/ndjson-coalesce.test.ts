import { describe, expect, it } from 'vitest';
import { coalesce } from '../../src/server/route.js';

async function collect(stream: NodeJS.ReadableStream): Promise<string[]> {
  const chunks: string[] = [];
  for await (const chunk of stream) chunks.push(String(chunk));
  return chunks;
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
    async function* slow(): AsyncGenerator<string> {
      yield 'a\n';
      yield 'b\n';
      await new Promise((resolve) => setTimeout(resolve, 20));
      yield 'c\n';
    }
    let waited = 0;
    const chunks = await collect(coalesce(slow(), () => waited++));
    expect(chunks).toEqual(['a\nb\n', 'c\n']);
    expect(waited).toBe(1);
    async function* quiet(): AsyncGenerator<string> {
      await new Promise((resolve) => setTimeout(resolve, 20));
      yield 'late\n';
    }
    let quietWaited = 0;
    const late = await collect(coalesce(quiet(), () => quietWaited++));
    expect(late).toEqual(['late\n']);
    expect(quietWaited).toBe(1);
  });
});
