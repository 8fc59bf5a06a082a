import { resolveConfig, type ConnectionOptions } from './config.js';
import { callOptions, HttpClient } from './http.js';
import type { CallOptions } from './types.js';
import type { ArtifactCollection, ArtifactRef, DeliveredArtifact, SkippedArtifact, StoredArtifact, UsageSample } from '../wire/index.js';

export type { ArtifactCollection, ArtifactRef, DeliveredArtifact, SkippedArtifact, StoredArtifact, UsageSample };

export interface CollectOptions extends CallOptions {
  /** Sandbox directory under /workspace. @default '/workspace/output' */
  dir?: string;
  /** A larger file is not copied (`skipped: 'too_large'`). @default 64 MiB */
  maxFileBytes?: number;
  /** Files past this total are not copied (`skipped: 'total_cap'`, `truncated`). @default 128 MiB */
  maxTotalBytes?: number;
}

export interface DownloadOptions<F extends 'bytes' | 'stream' = 'bytes' | 'stream'> extends ConnectionOptions {
  /** `bytes` (Uint8Array) or `stream` (ReadableStream, for large files). @default 'bytes' */
  format?: F;
}

/** A `sha256` or a `capsule://artifacts/<sha256>` uri, as the artifact's path on the server. */
function blobPath(ref: string): string {
  const id = ref.startsWith('capsule://artifacts/') ? ref.slice('capsule://artifacts/'.length) : ref;
  return `/v1/artifacts/${encodeURIComponent(id)}`;
}

/**
 * Results by reference: files of a sandbox copied into the server's artifact store, then read by
 * sha256 (also after the sandbox ended, until their retention ends). Only the tenant that
 * collected an artifact can read it.
 */
export class Artifacts {
  constructor(
    private readonly http: HttpClient,
    private readonly sandboxId: string,
  ) {}

  /** Copies the files of `dir` (the sandbox is frozen meanwhile) and returns their references. */
  async collect(options: CollectOptions = {}): Promise<ArtifactCollection> {
    const { dir, maxFileBytes, maxTotalBytes } = options;
    return this.http.json<ArtifactCollection>({
      method: 'POST',
      path: `/v1/sandboxes/${encodeURIComponent(this.sandboxId)}/artifacts`,
      json: { dir, maxFileBytes, maxTotalBytes },
      ...callOptions(options),
    });
  }

  /** The artifacts collected from this sandbox and still kept. */
  async list(options: CallOptions = {}): Promise<StoredArtifact[]> {
    const reply = await this.http.json<{ artifacts: StoredArtifact[] }>({ method: 'GET', path: '/v1/artifacts', query: { sandboxId: this.sandboxId }, ...callOptions(options) });
    return reply.artifacts;
  }

  /** The bytes of an artifact by sha256 or uri. */
  download(ref: string, options?: CallOptions & { format?: 'bytes' }): Promise<Uint8Array>;
  download(ref: string, options: CallOptions & { format: 'stream' }): Promise<ReadableStream<Uint8Array>>;
  async download(ref: string, options: CallOptions & { format?: 'bytes' | 'stream' } = {}): Promise<Uint8Array | ReadableStream<Uint8Array>> {
    return fetchBlob(this.http, ref, options.format ?? 'bytes', options);
  }

  /** Downloads an artifact without a Sandbox object (the sandbox may be gone). */
  static download(ref: string, options?: DownloadOptions<'bytes'>): Promise<Uint8Array>;
  static download(ref: string, options: DownloadOptions<'stream'>): Promise<ReadableStream<Uint8Array>>;
  static async download(ref: string, options: DownloadOptions = {}): Promise<Uint8Array | ReadableStream<Uint8Array>> {
    return fetchBlob(new HttpClient(resolveConfig(options)), ref, options.format ?? 'bytes', options);
  }

  /** The tenant's artifacts, optionally of one sandbox. */
  static async list(options: ConnectionOptions & { sandboxId?: string } = {}): Promise<StoredArtifact[]> {
    const http = new HttpClient(resolveConfig(options));
    const reply = await http.json<{ artifacts: StoredArtifact[] }>({ method: 'GET', path: '/v1/artifacts', query: { sandboxId: options.sandboxId }, ...callOptions(options) });
    return reply.artifacts;
  }

  /** Deletes the tenant's artifacts with this sha256 (the blob goes once nothing points at it). */
  static async delete(ref: string, options: ConnectionOptions = {}): Promise<void> {
    const http = new HttpClient(resolveConfig(options));
    await http.json({ method: 'DELETE', path: blobPath(ref), ...callOptions(options) });
  }
}

async function fetchBlob(http: HttpClient, ref: string, format: 'bytes' | 'stream', options: CallOptions): Promise<Uint8Array | ReadableStream<Uint8Array>> {
  const request = { method: 'GET' as const, path: blobPath(ref), ...callOptions(options) };
  if (format === 'stream') return (await http.open(request)).stream();
  return http.bytes(request);
}
