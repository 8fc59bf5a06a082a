import { posix } from 'node:path';
import { applyDiff, type ApplyPatchResult, type Editor } from '@openai/agents';
import type { ToolOutputImage } from '@openai/agents';
import type { Sandbox } from '../sdk/index.js';

/** Largest image view_image returns (what the model's image input takes). @default 10 MiB */
export const MAX_IMAGE_BYTES = 10 * 1024 * 1024;

/** A path as the sandbox sees it: relative paths are under the manifest's root. */
export function inRoot(root: string, path: string | undefined): string {
  if (path === undefined || path === '') return root;
  return posix.isAbsolute(path) ? posix.normalize(path) : posix.join(root, path);
}

/**
 * The Agents SDK's file editor (its apply_patch tool) on a Capsule sandbox: each operation
 * reads and writes through the SDK's files API, applying V4A diffs with the SDK's own applyDiff.
 */
export class CapsuleEditor implements Editor {
  constructor(
    private readonly sandbox: Sandbox,
    private readonly root: string,
  ) {}

  async createFile(operation: { type: 'create_file'; path: string; diff: string }): Promise<ApplyPatchResult> {
    const path = inRoot(this.root, operation.path);
    await this.sandbox.files.write(path, applyDiff('', operation.diff, 'create'));
    return { status: 'completed', output: `Created ${path}` };
  }

  async updateFile(operation: { type: 'update_file'; path: string; diff: string; moveTo?: string }): Promise<ApplyPatchResult> {
    const path = inRoot(this.root, operation.path);
    const updated = applyDiff(await this.sandbox.files.read(path), operation.diff);
    const target = operation.moveTo === undefined ? path : inRoot(this.root, operation.moveTo);
    await this.sandbox.files.write(target, updated);
    if (target !== path) await this.sandbox.files.remove(path);
    return { status: 'completed', output: target === path ? `Updated ${path}` : `Updated ${path} and moved it to ${target}` };
  }

  async deleteFile(operation: { type: 'delete_file'; path: string }): Promise<ApplyPatchResult> {
    const path = inRoot(this.root, operation.path);
    await this.sandbox.files.remove(path);
    return { status: 'completed', output: `Deleted ${path}` };
  }
}

/** The media type of an image by its first bytes (PNG, JPEG, GIF, WebP), or undefined. */
export function imageMediaType(bytes: Uint8Array): string | undefined {
  const starts = (...prefix: number[]) => prefix.every((byte, i) => bytes[i] === byte);
  if (starts(0x89, 0x50, 0x4e, 0x47)) return 'image/png';
  if (starts(0xff, 0xd8, 0xff)) return 'image/jpeg';
  if (starts(0x47, 0x49, 0x46, 0x38)) return 'image/gif';
  if (starts(0x52, 0x49, 0x46, 0x46) && bytes[8] === 0x57 && bytes[9] === 0x45 && bytes[10] === 0x42 && bytes[11] === 0x50) return 'image/webp';
  return undefined;
}

/** An image file of the sandbox as the Agents SDK's view_image output. */
export async function viewImage(sandbox: Sandbox, path: string): Promise<ToolOutputImage> {
  const entry = await sandbox.files.stat(path);
  if (entry.type !== 'file') throw new Error(`Image path is not a file: ${path}`);
  if (entry.size > MAX_IMAGE_BYTES) throw new Error(`Image ${path} exceeds the 10 MB limit (${entry.size} bytes)`);
  const bytes = await sandbox.files.read(path, { format: 'bytes' });
  const mediaType = imageMediaType(bytes);
  if (mediaType === undefined) throw new Error(`${path} is not a supported image (PNG, JPEG, GIF or WebP)`);
  return { type: 'image', image: { data: Uint8Array.from(bytes), mediaType } };
}
