import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { SandboxError } from '../../errors/index.js';
import { withLock } from '../../host/lock.host.js';
import { imageLayerKey } from '../keys.js';
import type { LayerStore } from '../layer-store.host.js';
import type { TemplateConfig } from '../records.js';
import { resolveUserInRoot } from '../rootfs/users.js';
import { readImageConfig } from './image-config.js';
import type { ImageRef } from './image-ref.js';
import { copyToLayout, firstOversizedOwner, inspectDigest, unpackLayout, type ImageToolContext } from './image-tools.host.js';

export interface ImportedImage {
  key: string;
  digest: string;
  config: TemplateConfig;
  /** False when the layer was already in the store (no pull, no unpack). */
  pulled: boolean;
}

/** The cache layout's tag for an image: its digest, so a layer and its blobs are found by digest. */
export function layoutTag(digest: string): string {
  return digest.replace(':', '-');
}

/**
 * Makes (or finds) the layer of an image: the digest is asked first (one manifest request), and
 * an image already imported is a lease on its layer and nothing else. Otherwise skopeo copies it
 * into the blob cache layout (reusing the blobs it has), umoci unpacks it into a pending layer,
 * the config is read, ownership checked against the 65,536 ids a sandbox maps, and the layer
 * published with the config beside it. `lease` holds the key against garbage collection.
 */
export async function importImageLayer(ref: ImageRef, layers: LayerStore, layout: string, context: ImageToolContext, lease: (key: string) => Promise<boolean>): Promise<ImportedImage> {
  context.onLine(`resolving ${ref.display}`);
  const digest = await inspectDigest(ref, context);
  const key = imageLayerKey(digest);
  if (await lease(key)) {
    const meta = await layers.meta(key);
    if (meta?.config) {
      context.onLine(`${ref.display} is ${digest}, already imported`);
      return { key, digest, config: meta.config, pulled: false };
    }
  }
  context.onLine(`pulling ${ref.display} (${digest})`);
  const tag = layoutTag(digest);
  const pending = await layers.createEmpty();
  try {
    const config = await withLock(`${layout}.lock`, async () => {
      await copyToLayout(ref, layout, tag, context);
      context.onLine('unpacking');
      await unpackLayout(layout, tag, pending.root, context);
      return readImageConfig(await readFile(join(layout, 'index.json'), 'utf8'), tag, (blob) => readFile(join(layout, 'blobs', ...blob.split(':')), 'utf8'));
    }, 3_600_000);
    const oversized = await firstOversizedOwner(pending.root);
    if (oversized !== undefined) {
      throw new SandboxError('IMAGE_UNSUPPORTED', `${ref.display} has ${oversized} owned by a uid or gid past 65535; a sandbox maps ids 0..65535 only`, {
        details: { image: ref.display, path: oversized, step: 'base' },
        hint: 'Rebuild the image with ids below 65536 (chown them), then import it again.',
      });
    }
    const user = await resolveUserInRoot(pending.root, config.user);
    if (typeof user === 'string') {
      throw new SandboxError('IMAGE_UNSUPPORTED', `the image's User cannot be used: ${user}`, { details: { image: ref.display, user: config.user, step: 'base' } });
    }
    const meta = await layers.publish(pending, { key, source: 'image', description: `${ref.display} ${digest}`, config: { ...config } });
    context.onLine(`imported ${ref.display}`);
    return { key, digest, config: meta.config ?? config, pulled: true };
  } catch (error) {
    await layers.discard(pending);
    throw error;
  }
}
