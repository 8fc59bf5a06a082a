import { resolveConfig, type ConnectionOptions } from './config.js';
import { callOptions, HttpClient } from './http.js';
import type { CallOptions, SnapshotInfo } from './types.js';

/**
 * The tenant's snapshots on a Capsule server (`sandbox.snapshot()` takes one; `Sandbox.create({
 * snapshot: id })` makes a sandbox from one). Another tenant's snapshot is `NotFoundError`.
 */
export class Snapshots {
  /** Every snapshot of this API key's tenant, oldest first. */
  static async list(options: ConnectionOptions = {}): Promise<SnapshotInfo[]> {
    const http = new HttpClient(resolveConfig(options));
    return (await http.json<{ snapshots: SnapshotInfo[] }>({ method: 'GET', path: '/v1/snapshots', ...callOptions(options) })).snapshots;
  }

  /** One snapshot with its lineage, size and creation time. */
  static async get(snapshotId: string, options: ConnectionOptions = {}): Promise<SnapshotInfo> {
    const http = new HttpClient(resolveConfig(options));
    return http.json<SnapshotInfo>({ method: 'GET', path: `/v1/snapshots/${encodeURIComponent(snapshotId)}`, ...callOptions(options) });
  }

  /** Deletes the snapshot and its data; `ConflictError` while a live sandbox was made from it. */
  static async delete(snapshotId: string, options: ConnectionOptions & CallOptions = {}): Promise<void> {
    const http = new HttpClient(resolveConfig(options));
    await http.json({ method: 'DELETE', path: `/v1/snapshots/${encodeURIComponent(snapshotId)}`, ...callOptions(options) });
  }
}
