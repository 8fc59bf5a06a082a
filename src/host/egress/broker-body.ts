import type { IncomingMessage } from 'node:http';
import { Transform, type Readable, type TransformCallback } from 'node:stream';
import { createBrotliDecompress, createGunzip, createInflate, createInflateRaw } from 'node:zlib';

/** The encodings the broker decodes before it redacts (`Content-Encoding`, RFC 9110). */
const DECODABLE = new Set(['gzip', 'x-gzip', 'deflate', 'br']);
/** More layers than this is not a real server's answer; it is refused. */
const MAX_LAYERS = 2;

/** An upstream body the broker cannot read in the clear, so it cannot redact it: refused. */
export class UndecodableBodyError extends Error {}

/** `Content-Encoding` as a list of codings in the order they were applied; identity dropped. */
export function contentCodings(header: string | string[] | undefined): string[] {
  const text = Array.isArray(header) ? header.join(',') : (header ?? '');
  return text.split(',').map((c) => c.trim().toLowerCase()).filter((c) => c !== '' && c !== 'identity');
}

/**
 * Reads up to `limit` bytes of a response body *after* undoing its content codings (gzip,
 * deflate, br), so that the secret is redacted in the bytes the sandbox will actually read, not
 * in a compressed form that hides it. The decoded size is bounded by `limit` (a decompression
 * bomb stops there); the rest is dropped and the upstream closed. A coding the broker cannot
 * decode rejects with UndecodableBodyError.
 */
export function readDecoded(response: IncomingMessage, limit: number): Promise<{ body: Buffer; truncated: boolean }> {
  const codings = contentCodings(response.headers['content-encoding']);
  const unknown = codings.find((c) => !DECODABLE.has(c));
  if (unknown !== undefined || codings.length > MAX_LAYERS) {
    response.destroy();
    const why = unknown === undefined ? `${codings.length} layers of content coding` : `content coding "${unknown}"`;
    return Promise.reject(new UndecodableBodyError(`the upstream answered with ${why}, which the broker cannot decode to redact; refused`));
  }
  const stages: Readable[] = [response];
  let stream: Readable = response;
  for (const coding of [...codings].reverse()) {
    const decoder = decoderFor(coding);
    stream.once('error', (error) => decoder.destroy(error));
    stream = stream.pipe(decoder);
    stages.push(decoder);
  }
  return readCapped(stream, limit, () => stages.forEach((s) => s.destroy()));
}

function decoderFor(coding: string): Transform {
  if (coding === 'br') return createBrotliDecompress();
  if (coding === 'deflate') return new InflateEither();
  return createGunzip();
}

/**
 * `deflate` is meant to be zlib-wrapped (RFC 1950) but some servers send raw deflate (RFC 1951);
 * the first two bytes tell which.
 */
class InflateEither extends Transform {
  private inner: Transform | undefined;
  private head = Buffer.alloc(0);

  override _transform(chunk: Buffer, _encoding: BufferEncoding, callback: TransformCallback): void {
    if (this.inner) {
      this.inner.write(chunk, () => callback());
      return;
    }
    this.head = Buffer.concat([this.head, chunk]);
    if (this.head.length < 2) return callback();
    const [cmf = 0, flg = 0] = this.head;
    const zlibWrapped = (cmf & 0x0f) === 8 && ((cmf << 8) | flg) % 31 === 0;
    const inner = zlibWrapped ? createInflate() : createInflateRaw();
    this.inner = inner;
    inner.on('data', (data: Buffer) => this.push(data));
    inner.once('error', (error) => this.destroy(error));
    inner.write(this.head, () => callback());
  }

  override _flush(callback: TransformCallback): void {
    if (!this.inner) return callback(this.head.length === 0 ? null : new Error('a deflate body of one byte'));
    this.inner.once('end', () => callback());
    this.inner.end();
  }

  override _destroy(error: Error | null, callback: (error: Error | null) => void): void {
    this.inner?.destroy();
    callback(error);
  }
}

/** Reads up to `limit` bytes of a stream; past it `stop` ends the whole chain. */
export function readCapped(stream: Readable, limit: number, stop: () => void = () => stream.destroy()): Promise<{ body: Buffer; truncated: boolean }> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    let done = false;
    stream.on('data', (chunk: Buffer) => {
      if (done) return;
      chunks.push(chunk.subarray(0, limit - size));
      size += Math.min(chunk.length, limit - size);
      if (size >= limit) {
        done = true;
        stop();
        resolve({ body: Buffer.concat(chunks), truncated: true });
      }
    });
    stream.once('end', () => {
      done = true;
      resolve({ body: Buffer.concat(chunks), truncated: false });
    });
    stream.once('error', (error) => {
      if (done) return;
      done = true;
      reject(error);
    });
  });
}
