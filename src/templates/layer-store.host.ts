import { mkdir, readdir, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { SandboxError } from '../errors/index.js';
import { runCommand } from '../host/run-command.host.js';
import { subvolumeId, type WorkspaceVolume } from '../host/volume.host.js';
import { pathExists } from '../host/fs-util.js';
import { withLock } from '../host/lock.host.js';
import { isOwnerAlive, ownedName } from './owner.js';
import { isLayerKey } from './keys.js';
import type { TemplateConfig } from './records.js';

/** Where a layer came from. */
export type LayerSource = 'debian' | 'image' | 'step' | 'scratch';

export interface LayerMeta {
  key: string;
  /** The layer this one was snapshotted from; garbage collection keeps a kept layer's parent. */
  parent?: string;
  source: LayerSource;
  /** One line for `ls`: the suite, the image digest, or the build step. */
  description: string;
  createdAt: string;
  subvolumeId: number;
  /** An image's own config (Env, WorkingDir, User, Entrypoint + Cmd), kept with its layer. */
  config?: TemplateConfig;
  /** The tenant whose build made it (absent: the operator's, or made before layers were charged). */
  owner?: string;
  /**
   * Bytes the layer added over its parent, measured when it was made: its size, and what its
   * owner's quota is charged when it has one. Absent on layers made before it was recorded.
   */
  addedBytes?: number;
}

export interface LayerInfo extends LayerMeta {
  /** Bytes the layer's root refers to: what it added and what each of its parents did. */
  referencedBytes?: number;
  /** Bytes the layer itself added: what deleting it (and the children that need it) frees. */
  exclusiveBytes?: number;
}

/** A layer being filled: a writable subvolume at `root`, this process's until published or discarded. */
export interface PendingLayer {
  readonly name: string;
  readonly root: string;
  /** What it adds over its parent, measured when it was made from a subvolume that holds exactly that. */
  readonly addedBytes?: number;
}

/**
 * A tenant build's charge for the layers it publishes: each new layer's added bytes are reserved
 * before it is published (QUOTA_EXCEEDED leaves it unpublished, for the caller to discard).
 */
export interface LayerCharge {
  /** The tenant whose quota pays (never the public owner). */
  owner: string;
  /** Throws QUOTA_EXCEEDED when `bytes` more do not fit the owner's quota, else charges them. */
  reserve(bytes: number): void;
  release(bytes: number): void;
  /** Bytes left in the owner's quota now. */
  room(): number;
}

export interface CollectOptions {
  /** Layers something durable refers to: every template's top layer. Their parents are kept too. */
  roots: Iterable<string>;
  /** The engine's word on layers under live sandboxes. @default () => false */
  isInUse?: (key: string) => boolean;
  /** Only these may be deleted (a failed build's own layers, a tenant's). @default every layer */
  only?: (layer: LayerMeta) => boolean;
}

export interface CollectReport {
  removed: string[];
  /** What the removed layers added (their exclusive bytes, as LayerStore.usage gives them). */
  freedBytes: number;
}

/**
 * Template layers on the workspace volume: content-addressed, read-only btrfs subvolumes at
 * `layers/<key>/root` beside their `meta.json`. A layer is filled in `layers-pending/<owner>/root`
 * and published by one rename of that directory, so a reader sees a layer whole or not at all;
 * a crashed or cancelled fill leaves only a pending directory that `reconcile()` removes once its
 * owner process is gone. Deleting unpublishes first (a rename back into pending), for the same
 * reason. See docs/decisions/011-template-storage.md.
 */
export class LayerStore {
  readonly layersDir: string;
  readonly pendingDir: string;
  private readonly leasesDir: string;

  /** Layers this store published (a charged store: one build's). */
  readonly published: string[] = [];

  constructor(
    readonly volume: WorkspaceVolume,
    private readonly charge?: LayerCharge,
  ) {
    this.layersDir = join(volume.mountPoint, 'layers');
    this.pendingDir = join(volume.mountPoint, 'layers-pending');
    this.leasesDir = join(volume.mountPoint, 'layer-leases');
  }

  /**
   * Bytes a build step may still write before its owner's quota is full (undefined: not charged).
   * Throws QUOTA_EXCEEDED when not even `atLeast` bytes are left.
   */
  room(atLeast = 0): number | undefined {
    if (!this.charge) return undefined;
    const room = this.charge.room();
    if (room < atLeast) {
      this.charge.reserve(atLeast); // refused: the owner's quota has no room for it
      this.charge.release(atLeast);
    }
    return room;
  }

  /** The same store for one tenant build: what it publishes is owned by and charged to `charge.owner`. */
  charged(charge: LayerCharge): LayerStore {
    return new LayerStore(this.volume, charge);
  }

  async ensure(): Promise<void> {
    await this.volume.ensure();
    for (const dir of [this.layersDir, this.pendingDir, this.leasesDir]) await mkdir(dir, { recursive: true, mode: 0o700 });
  }

  /** The read-only root filesystem of a published layer. */
  rootOf(key: string): string {
    return join(this.layersDir, checkedKey(key), 'root');
  }

  async has(key: string): Promise<boolean> {
    return pathExists(join(this.layersDir, checkedKey(key), 'meta.json'));
  }

  async meta(key: string): Promise<LayerMeta | undefined> {
    const text = await readFile(join(this.layersDir, checkedKey(key), 'meta.json'), 'utf8').catch(() => undefined);
    return text === undefined ? undefined : (JSON.parse(text) as LayerMeta);
  }

  /** A new, empty pending layer (a fresh subvolume: root-owned, 0755). */
  async createEmpty(): Promise<PendingLayer> {
    return this.newPending((root) => runCommand(['btrfs', 'subvolume', 'create', root]));
  }

  /** A new pending layer that starts as a writable copy-on-write snapshot of layer `parent`. */
  async createFrom(parent: string): Promise<PendingLayer> {
    if (!(await this.has(parent))) throw missingLayer(parent);
    // Measured at publish: what is written into the copy is its own (the parent is read-only),
    // its exclusive bytes under either quota mode.
    return this.newPending((root) => runCommand(['btrfs', 'subvolume', 'snapshot', this.rootOf(parent), root]));
  }

  /**
   * A new pending layer that is a snapshot of a build step's sandbox root, a writable snapshot of
   * the parent layer: what it adds is what the step wrote.
   */
  async createFromDir(subvolume: string): Promise<PendingLayer> {
    // A build step's root holds exactly what the step added (its exclusive bytes): measured before
    // the snapshot shares them, since the copy's own count stays 0 while the root exists (and for
    // good under simple quotas, which keep the bytes charged to the root that wrote them).
    const addedBytes = await this.exclusiveBytes(subvolume);
    const pending = await this.newPending((root) => runCommand(['btrfs', 'subvolume', 'snapshot', subvolume, root]));
    return { ...pending, addedBytes };
  }

  /** Exclusive bytes of a subvolume on the volume after a commit (0 when its quota group is unknown). */
  private async exclusiveBytes(dir: string): Promise<number> {
    await runCommand(['btrfs', 'filesystem', 'sync', this.volume.mountPoint]);
    const id = await subvolumeId(dir);
    return (id === undefined ? undefined : (await this.volume.subvolumeUsage(id))?.exclusiveBytes) ?? 0;
  }

  /**
   * A writable snapshot of layer `key` at `dir` (which must not exist), for a sandbox's root or a
   * build step's working copy. The caller owns it and deletes it with `deleteSnapshot`.
   */
  async snapshotWritable(key: string, dir: string): Promise<string> {
    if (!(await this.has(key))) throw missingLayer(key);
    await runCommand(['btrfs', 'subvolume', 'snapshot', this.rootOf(key), dir]);
    return dir;
  }

  /** Deletes a writable snapshot made by `snapshotWritable` (absent is fine). */
  async deleteSnapshot(dir: string): Promise<void> {
    if (await pathExists(dir)) await runCommand(['btrfs', 'subvolume', 'delete', dir]);
  }

  private async newPending(fill: (root: string) => Promise<unknown>): Promise<PendingLayer> {
    const name = ownedName();
    const dir = join(this.pendingDir, name);
    await mkdir(dir, { mode: 0o700 });
    const pending = { name, root: join(dir, 'root') };
    try {
      await fill(pending.root);
    } catch (error) {
      await this.discard(pending);
      throw error;
    }
    return pending;
  }

  /**
   * Makes `pending` the read-only layer `meta.key`. When that layer already exists (another build
   * made the same step meanwhile) the pending copy is discarded and the existing layer returned.
   */
  async publish(pending: PendingLayer, meta: Omit<LayerMeta, 'createdAt' | 'subvolumeId' | 'owner' | 'addedBytes'>): Promise<LayerMeta> {
    checkedKey(meta.key);
    // Its size is recorded with it; a charged build pays for it before it exists: past the quota it is not published.
    const addedBytes = pending.addedBytes ?? (await this.exclusiveBytes(pending.root));
    this.charge?.reserve(addedBytes);
    let charged = this.charge !== undefined;
    const uncharge = () => {
      if (charged) this.charge!.release(addedBytes);
      charged = false;
    };
    try {
      await runCommand(['btrfs', 'property', 'set', '-ts', pending.root, 'ro', 'true']);
      const id = await subvolumeId(pending.root);
      if (id === undefined) throw new SandboxError('INTERNAL', `${pending.root} is not a btrfs subvolume`);
      const owned = this.charge ? { owner: this.charge.owner } : {};
      const full: LayerMeta = { ...meta, ...owned, addedBytes, createdAt: new Date().toISOString(), subvolumeId: id };
      await writeFile(join(this.pendingDir, pending.name, 'meta.json'), `${JSON.stringify(full)}\n`, { mode: 0o600 });
      try {
        await rename(join(this.pendingDir, pending.name), join(this.layersDir, meta.key));
        this.published.push(meta.key);
        return full;
      } catch (error) {
        const code = (error as NodeJS.ErrnoException).code;
        if (code !== 'ENOTEMPTY' && code !== 'EEXIST') throw error;
        // Another build made the same layer meanwhile: that one stays, with its own owner.
        uncharge();
        await this.discard(pending);
        const existing = await this.meta(meta.key);
        if (!existing) throw error;
        return existing;
      }
    } catch (error) {
      uncharge();
      throw error;
    }
  }

  /** Every published layer's meta, without sizes (no btrfs call). */
  async metas(): Promise<LayerMeta[]> {
    const keys = (await readdir(this.layersDir).catch(() => [] as string[])).filter(isLayerKey);
    const metas = await Promise.all(keys.map((key) => this.meta(key)));
    return metas.filter((meta): meta is LayerMeta => meta !== undefined);
  }

  /** Removes a pending layer (cancel, failure). Safe on a half-made one and twice. */
  async discard(pending: PendingLayer): Promise<void> {
    await removeLayerDir(join(this.pendingDir, pending.name));
  }

  /** Every published layer with its sizes (see usage). */
  async list(): Promise<LayerInfo[]> {
    const metas = await this.metas();
    const byKey = new Map(metas.map((meta) => [meta.key, meta]));
    const layers: LayerInfo[] = [];
    const sync = this.syncOnce();
    for (const meta of metas) layers.push({ ...meta, ...(await this.sizeOf(meta, (key) => byKey.get(key), sync)) });
    return layers;
  }

  /**
   * Referenced and exclusive bytes of one layer. From the sizes recorded when its chain was made:
   * exclusive is what it added, referenced that and what each parent added. Under simple quotas
   * these are the only figures there are (a layer snapshotted from a build step's root holds
   * nothing in its own quota group: the step's root wrote the bytes, decision 022); under full
   * quota groups a parent's exclusive count falls to 0 once children share it. A chain with a
   * layer made before sizes were recorded is read off the layer's quota group, after a commit.
   */
  async usage(key: string): Promise<{ referencedBytes: number; exclusiveBytes: number } | undefined> {
    const meta = await this.meta(key);
    return meta && this.sizeOf(meta, (parent) => this.meta(parent), this.syncOnce());
  }

  private async sizeOf(
    meta: LayerMeta,
    metaOf: (key: string) => LayerMeta | undefined | Promise<LayerMeta | undefined>,
    sync: () => Promise<void>,
  ): Promise<{ referencedBytes: number; exclusiveBytes: number } | undefined> {
    let referencedBytes = 0;
    const seen = new Set<string>();
    for (let layer: LayerMeta | undefined = meta; layer !== undefined && !seen.has(layer.key); ) {
      seen.add(layer.key);
      const parent: LayerMeta | undefined = layer.parent === undefined ? undefined : await metaOf(layer.parent);
      if (layer.addedBytes === undefined || (layer.parent !== undefined && parent === undefined)) {
        await sync();
        return this.volume.subvolumeUsage(meta.subvolumeId);
      }
      referencedBytes += layer.addedBytes;
      layer = parent;
    }
    return { referencedBytes, exclusiveBytes: meta.addedBytes! };
  }

  /** One `btrfs filesystem sync` at the first call, so that quota groups read after it are current. */
  private syncOnce(): () => Promise<void> {
    let synced: Promise<unknown> | undefined;
    return async () => {
      synced ??= runCommand(['btrfs', 'filesystem', 'sync', this.volume.mountPoint]);
      await synced;
    };
  }

  /** Deletes a layer: unpublished by a rename first, so a crash midway leaves only a pending dir. */
  async delete(key: string): Promise<void> {
    await this.volume.spares.discard(this.rootOf(key));
    const name = ownedName();
    try {
      await rename(join(this.layersDir, checkedKey(key)), join(this.pendingDir, name));
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === 'ENOENT') return;
      throw error;
    }
    await removeLayerDir(join(this.pendingDir, name));
  }

  /**
   * Holds `keys` against garbage collection for this process's lifetime (a build's base and the
   * layers it made before its template exists). Returns true for each key that exists now: a key
   * leased and found here cannot be collected later, by this process or another.
   */
  async lease(lease: string, keys: string[]): Promise<boolean[]> {
    const file = join(this.leasesDir, lease);
    return withLock(join(this.volume.mountPoint, 'layers.lock'), async () => {
      const held = new Set<string>(JSON.parse(await readFile(file, 'utf8').catch(() => '[]')) as string[]);
      for (const key of keys) held.add(checkedKey(key));
      await writeFile(file, JSON.stringify([...held]), { mode: 0o600 });
      return Promise.all(keys.map((key) => this.has(key)));
    });
  }

  /** Ends a lease (a build finished or failed). */
  async release(lease: string): Promise<void> {
    await rm(join(this.leasesDir, lease), { force: true });
  }

  /**
   * Deletes every layer that no root, lease or live sandbox needs, keeping each kept layer's
   * ancestors. Runs under the store's lock, so a lease taken meanwhile waits and then sees the
   * layer gone (and the build rebuilds it) instead of racing the delete.
   */
  async collect(options: CollectOptions): Promise<CollectReport> {
    const isInUse = options.isInUse ?? (() => false);
    return withLock(join(this.volume.mountPoint, 'layers.lock'), async () => {
      const layers = await this.list();
      const byKey = new Map(layers.map((layer) => [layer.key, layer]));
      const keep = new Set<string>();
      const visit = (key: string | undefined): void => {
        for (let cursor = key; cursor !== undefined && !keep.has(cursor); cursor = byKey.get(cursor)?.parent) keep.add(cursor);
      };
      for (const key of options.roots) visit(key);
      for (const key of await this.leasedKeys()) visit(key);
      for (const layer of layers) if (isInUse(layer.key)) visit(layer.key);
      const report: CollectReport = { removed: [], freedBytes: 0 };
      for (const layer of layers) {
        if (keep.has(layer.key) || (options.only && !options.only(layer))) continue;
        await this.delete(layer.key);
        report.removed.push(layer.key);
        report.freedBytes += layer.exclusiveBytes ?? 0;
      }
      return report;
    }, 600_000);
  }

  /** Keys held by leases of live processes; leases of dead ones are removed. */
  private async leasedKeys(): Promise<string[]> {
    const keys: string[] = [];
    for (const name of await readdir(this.leasesDir).catch(() => [] as string[])) {
      const file = join(this.leasesDir, name);
      if (!isOwnerAlive(name)) {
        await rm(file, { force: true });
        continue;
      }
      keys.push(...(JSON.parse(await readFile(file, 'utf8').catch(() => '[]')) as string[]));
    }
    return keys;
  }

  /** Removes pending layers and leases whose owner process is gone (a crash, a kill). */
  async reconcile(): Promise<string[]> {
    const removed: string[] = [];
    for (const name of await readdir(this.pendingDir).catch(() => [] as string[])) {
      if (isOwnerAlive(name)) continue;
      await removeLayerDir(join(this.pendingDir, name));
      removed.push(`pending layer ${name}`);
    }
    await this.leasedKeys();
    return removed;
  }

  /** Pending layers of this volume, for leak checks. */
  async pending(): Promise<string[]> {
    return readdir(this.pendingDir).catch(() => [] as string[]);
  }
}

/** Deletes `dir/root` as a subvolume (it may be read-only) or a plain dir, then `dir`. */
async function removeLayerDir(dir: string): Promise<void> {
  const root = join(dir, 'root');
  if (await pathExists(root)) {
    const id = await subvolumeId(root);
    if (id !== undefined && id !== 5) await runCommand(['btrfs', 'subvolume', 'delete', root]);
  }
  await rm(dir, { recursive: true, force: true });
}

function checkedKey(key: string): string {
  if (!isLayerKey(key)) throw new SandboxError('INTERNAL', `not a layer key: ${JSON.stringify(key)}`);
  return key;
}

function missingLayer(key: string): SandboxError {
  return new SandboxError('TEMPLATE_NOT_FOUND', `layer ${key.slice(0, 12)} is not in the layer store`, {
    details: { layer: key },
    hint: 'It was pruned; rebuild the template (capsule template ls shows what exists).',
  });
}
