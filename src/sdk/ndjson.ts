const NEWLINE = 0x0a;

/**
 * Reads an NDJSON body one object at a time, from Node's reply chunks or a web stream (both are
 * async iterables of bytes). Lines are split on the newline byte (never part of a UTF-8 sequence),
 * so a line or a character split across chunks is joined before it is decoded; a last line without
 * a newline is still parsed. Leaving the loop early ends the source (a web stream is cancelled).
 */
export async function* readNdjson<T = unknown>(body: AsyncIterable<Uint8Array>): AsyncGenerator<T, void, undefined> {
  let pending: Buffer | undefined;
  for await (const piece of body) {
    let chunk = Buffer.isBuffer(piece) ? piece : Buffer.from(piece.buffer, piece.byteOffset, piece.byteLength);
    if (pending !== undefined) {
      chunk = Buffer.concat([pending, chunk]);
      pending = undefined;
    }
    let start = 0;
    let newline: number;
    while ((newline = chunk.indexOf(NEWLINE, start)) !== -1) {
      const line = chunk.toString('utf8', start, newline);
      start = newline + 1;
      if (line.trim() !== '') yield JSON.parse(line) as T;
    }
    if (start < chunk.length) pending = chunk.subarray(start);
  }
  const last = pending?.toString('utf8') ?? '';
  if (last.trim() !== '') yield JSON.parse(last) as T;
}
