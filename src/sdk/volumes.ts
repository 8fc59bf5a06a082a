import { resolveConfig, type ConnectionOptions } from './config.js';
import { callOptions, HttpClient } from './http.js';
import type { VolumeInfo } from './types.js';

/**
 * The tenant's named volumes: quota'd directories that outlive sandboxes and server restarts,
 * mounted by `Sandbox.create({ volumes: [{ name, path, readOnly? }] })`.
 */
export class Volumes {
  static async create(name: string, sizeBytes: number, options: ConnectionOptions & { shared?: boolean } = {}): Promise<VolumeInfo> {
    const http = new HttpClient(resolveConfig(options));
    const json = { name, sizeBytes, ...(options.shared !== undefined ? { shared: options.shared } : {}) };
    return http.json<VolumeInfo>({ method: 'POST', path: '/v1/volumes', json, ...callOptions(options) });
  }

  /**
   * A new volume that starts as the copy of volume `from.volume` that snapshot `from.snapshotId`
   * kept (`sandbox.snapshot({ includeVolumes: true })`), of the copied volume's size unless
   * `sizeBytes` says otherwise. It is a volume of its own: the snapshot may go, it stays.
   */
  static async createFrom(name: string, from: { snapshotId: string; volume: string }, options: ConnectionOptions & { sizeBytes?: number; shared?: boolean } = {}): Promise<VolumeInfo> {
    const http = new HttpClient(resolveConfig(options));
    const json = { name, from, ...(options.sizeBytes !== undefined ? { sizeBytes: options.sizeBytes } : {}), ...(options.shared !== undefined ? { shared: options.shared } : {}) };
    return http.json<VolumeInfo>({ method: 'POST', path: '/v1/volumes', json, ...callOptions(options) });
  }

  static async list(options: ConnectionOptions = {}): Promise<VolumeInfo[]> {
    const http = new HttpClient(resolveConfig(options));
    return (await http.json<{ volumes: VolumeInfo[] }>({ method: 'GET', path: '/v1/volumes', ...callOptions(options) })).volumes;
  }

  static async get(name: string, options: ConnectionOptions = {}): Promise<VolumeInfo> {
    const http = new HttpClient(resolveConfig(options));
    return http.json<VolumeInfo>({ method: 'GET', path: `/v1/volumes/${encodeURIComponent(name)}`, ...callOptions(options) });
  }

  /** Deletes the volume and its data; `ConflictError` while a live sandbox mounts it. */
  static async delete(name: string, options: ConnectionOptions = {}): Promise<void> {
    const http = new HttpClient(resolveConfig(options));
    await http.json({ method: 'DELETE', path: `/v1/volumes/${encodeURIComponent(name)}`, ...callOptions(options) });
  }
}
