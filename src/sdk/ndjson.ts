/**
 * Reads an NDJSON body one object at a time. Lines may arrive split across chunks; a partial last
 * line without a newline is still parsed. Leaving the loop early cancels the body.
 */
export async function* readNdjson<T = unknown>(body: ReadableStream<Uint8Array>): AsyncGenerator<T, void, undefined> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let pending = '';
  let finished = false;
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      pending += decoder.decode(value, { stream: true });
      let newline: number;
      while ((newline = pending.indexOf('\n')) !== -1) {
        const line = pending.slice(0, newline).trim();
        pending = pending.slice(newline + 1);
        if (line !== '') yield JSON.parse(line) as T;
      }
    }
    pending += decoder.decode();
    const last = pending.trim();
    if (last !== '') yield JSON.parse(last) as T;
    finished = true;
  } finally {
    if (!finished) await reader.cancel().catch(() => undefined);
    reader.releaseLock();
  }
}
