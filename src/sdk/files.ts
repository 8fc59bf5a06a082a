import { AbortedError, FileNotFoundError, errorFromStreamEvent } from './errors.js';
import { callOptions, type HttpClient, type RequestBody } from './http.js';
import { readNdjson } from './ndjson.js';
import type { CallOptions, FileEntry, WatchEvent } from './types.js';

export type ReadFormat = 'text' | 'bytes' | 'stream';
export interface ReadOptions<F extends ReadFormat = ReadFormat> extends CallOptions {
  /** `text` (UTF-8), `bytes` (Uint8Array) or `stream` (ReadableStream). @default 'text' */
  format?: F;
}

/** What `files.write` takes; streams are sent as they are read, never buffered whole. */
export type WriteData = string | Uint8Array | ArrayBuffer | Blob | ReadableStream<Uint8Array> | AsyncIterable<Uint8Array>;

export interface WatchOptions extends CallOptions {
  /**
   * Deadline for the server to answer. The server may answer only with the first event, so by
   * default there is none; `signal` or the handle's `stop()` ends the watch. @default 0 (none)
   */
  timeoutMs?: number;
  /** Also watch subdirectories. @default false */
  recursive?: boolean;
  onEvent: (event: WatchEvent) => void;
}

const WATCH_EVENT_TYPES: ReadonlySet<string> = new Set(['create', 'write', 'remove', 'rename', 'chmod'] satisfies WatchEvent['type'][]);

/** A running watch. `stop()` ends it; `done` settles when it ended (rejects if it broke). */
export interface WatchHandle {
  stop(): void;
  readonly done: Promise<void>;
}

/**
 * Files of one sandbox, by the path the sandbox sees (relative paths resolve against
 * /workspace). Writes are atomic and create missing parents.
 */
export class Files {
  constructor(
    private readonly http: HttpClient,
    private readonly base: string,
  ) {}

  read(path: string, options?: ReadOptions<'text'>): Promise<string>;
  read(path: string, options: ReadOptions<'bytes'>): Promise<Uint8Array>;
  read(path: string, options: ReadOptions<'stream'>): Promise<ReadableStream<Uint8Array>>;
  async read(path: string, options: ReadOptions = {}): Promise<string | Uint8Array | ReadableStream<Uint8Array>> {
    const request = { method: 'GET' as const, path: `${this.base}/files`, query: { path }, timeoutMs: options.timeoutMs, signal: options.signal };
    if (options.format === 'stream') return (await this.http.open(request)).stream();
    const bytes = await this.http.bytes(request);
    return options.format === 'bytes' ? bytes : new TextDecoder().decode(bytes);
  }

  /** Replaces (or creates) the file atomically; readers never see a partial write. */
  async write(path: string, data: WriteData, options: CallOptions = {}): Promise<FileEntry> {
    return this.http.json<FileEntry>({ method: 'PUT', path: `${this.base}/files`, query: { path }, body: await toBody(data), ...callOptions(options) });
  }

  /** Entries below `path`, `depth` levels deep. @default depth 1 */
  async list(path: string, options: CallOptions & { depth?: number } = {}): Promise<FileEntry[]> {
    const reply = await this.http.json<{ entries: FileEntry[] }>({
      method: 'GET',
      path: `${this.base}/files/list`,
      query: { path, depth: options.depth },
      ...callOptions(options),
    });
    return reply.entries;
  }

  async stat(path: string, options: CallOptions = {}): Promise<FileEntry> {
    return this.http.json<FileEntry>({ method: 'GET', path: `${this.base}/files/stat`, query: { path }, ...callOptions(options) });
  }

  /** False only when nothing is at `path`; other failures throw. */
  async exists(path: string, options: CallOptions = {}): Promise<boolean> {
    try {
      await this.stat(path, options);
      return true;
    } catch (error) {
      if (error instanceof FileNotFoundError) return false;
      throw error;
    }
  }

  /** Creates a directory and its parents. */
  async makeDir(path: string, options: CallOptions = {}): Promise<FileEntry> {
    return this.http.json<FileEntry>({ method: 'POST', path: `${this.base}/files/mkdir`, json: { path }, ...callOptions(options) });
  }

  async move(source: string, destination: string, options: CallOptions = {}): Promise<FileEntry> {
    return this.http.json<FileEntry>({ method: 'POST', path: `${this.base}/files/move`, json: { source, destination }, ...callOptions(options) });
  }

  /** Removes a file or a directory with its contents. */
  async remove(path: string, options: CallOptions = {}): Promise<void> {
    await this.http.json({ method: 'DELETE', path: `${this.base}/files`, query: { path }, ...callOptions(options) });
  }

  /**
   * Watches `path` and calls `onEvent` for each change. Resolves once the server accepted the
   * watch; the handle's `stop()` (or `signal`) ends it.
   */
  async watch(path: string, options: WatchOptions): Promise<WatchHandle> {
    const stop = new AbortController();
    const signal = options.signal ? AbortSignal.any([options.signal, stop.signal]) : stop.signal;
    const open = await this.http.open({
      method: 'GET',
      path: `${this.base}/files/watch`,
      query: { path, recursive: options.recursive === true },
      timeoutMs: options.timeoutMs ?? 0,
      signal,
    });
    const done = (async () => {
      try {
        for await (const event of readNdjson<WatchEvent | { type: 'error'; error: unknown }>(open.chunks())) {
          if (event.type === 'error') throw errorFromStreamEvent(event.error);
          // Lines of other types (a newer server's heartbeats, say) are not changes.
          if (WATCH_EVENT_TYPES.has(event.type)) options.onEvent(event);
        }
      } catch (error) {
        if (error instanceof AbortedError && signal.aborted) return;
        throw error;
      } finally {
        open.close();
      }
    })();
    // Observed by whoever awaits `done`; this keeps an unobserved failure from crashing Node.
    done.catch(() => undefined);
    return { stop: () => stop.abort(), done };
  }
}

async function toBody(data: WriteData): Promise<RequestBody> {
  if (data instanceof ArrayBuffer) return new Uint8Array(data);
  if (data instanceof Blob) return new Uint8Array(await data.arrayBuffer());
  // A string or bytes is sent (and replayed) as is; a stream, web or async iterable, as it is read.
  return data;
}

