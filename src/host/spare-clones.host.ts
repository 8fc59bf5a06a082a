import { createHash, randomBytes } from 'node:crypto';
import { mkdir, readdir, rename } from 'node:fs/promises';
import { join, relative } from 'node:path';
import { pathExists } from './fs-util.js';
import { runCommand } from './run-command.host.js';

/** Readies a new spare (a writable subvolume) before it is offered. */
export type Prepare = (dir: string) => Promise<void>;

/** Sources with a spare at once, server-wide (each spare is a subvolume of a few KiB, uncharged). */
export const DEFAULT_MAX_SPARES = 64;
/** Spares one source may ask for (`keep`'s depth). */
export const MAX_SPARE_DEPTH = 2;

/**
 * One ready writable clone of each read-only subvolume that sandboxes start from (a snapshot's
 * disk, a template's layer), kept in `spares/` on the workspace volume. A btrfs snapshot waits
 * for a transaction commit: 1.5–3.5 ms on this machine's loop-mounted volume, tens of ms while
 * the roots of deleted sandboxes are being dropped. A rename waits for none. So a create takes
 * the spare when one is ready (a rename, by the host or by capsule-launch), the next spare is
 * made in the background, and a create that finds none (another one took it) makes its snapshot
 * itself, as every create did before.
 *
 * A spare is the volume's, never a tenant's: it shares every extent with its source (a new
 * subvolume's few KiB). It is kept only for sources someone asked to `keep` (a snapshot taken to
 * create from, a template an engine creates from; not a fork's snapshot, whose creates run at
 * once and share one commit, nor a one-shot run's template), is deleted before its source is
 * (`discard`), at close, and at the next start after a crash (`clear`).
 *
 * A source kept with depth 2 (a template's layer) has two, so that a create right behind another
 * (create, run one command, kill, create again) finds one too while the replacement of the first
 * waits for the sandbox's first command (decision 025).
 *
 * At most `maxSpares` sources have spares at a time, the ones kept or created from most recently:
 * a spare is uncharged (no tenant's quota sees it), so a tenant that takes many snapshots must
 * not make as many subvolumes on the volume. A source past the bound loses its spare (its
 * creates snapshot it themselves) until a create from it brings it back among the recent ones.
 */
export class SpareClones {
  private readonly dir: string;
  /**
   * Sources someone asked to `keep` (until discarded), with what readies each spare before it is
   * offered and how many are kept ready.
   */
  private readonly wanted = new Map<string, { prepare: Prepare | undefined; depth: number }>();
  /** The kept sources that have a spare, least recently used first; at most `maxSpares`. */
  private readonly kept = new Set<string>();
  private readonly making = new Map<string, Promise<void>>();
  /** Sources a create took from while their make ran past that slot: made again once it ends. */
  private readonly again = new Set<string>();
  /** Spares of sources that fell past the bound, being deleted. */
  private readonly dropping = new Set<Promise<void>>();

  constructor(
    private readonly volumeRoot: string,
    private readonly deleteSubvolumes: (paths: string[]) => Promise<void>,
    private readonly maxSpares = DEFAULT_MAX_SPARES,
  ) {
    this.dir = join(volumeRoot, 'spares');
  }

  /** Where the (first) spare of `source` is when it is ready: named by the source's path on the volume. */
  pathOf(source: string): string {
    return join(this.dir, createHash('sha256').update(relative(this.volumeRoot, source)).digest('hex').slice(0, 32));
  }

  /** Where each spare of `source` is, the first first: `depth` of them (at most MAX_SPARE_DEPTH). */
  private slotsOf(source: string, depth = this.wanted.get(source)?.depth ?? 1): string[] {
    const first = this.pathOf(source);
    return Array.from({ length: Math.min(depth, MAX_SPARE_DEPTH) }, (_, index) => (index === 0 ? first : `${first}-${index + 1}`));
  }

  /** Moves a ready spare of `source` to `target` (which must not exist): false when none is ready. */
  async take(source: string, target: string): Promise<boolean> {
    for (const slot of this.slotsOf(source)) {
      try {
        await rename(slot, target);
        return true;
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code !== 'ENOENT') throw error;
      }
    }
    return false;
  }

  /**
   * Makes `target` a writable clone of `source`: its spare when one is ready, else a snapshot of
   * it here; then the next spare is made when the source is kept, unless `replenishLater`: the
   * caller calls `replenish` once its create can share the host (a spare's making spawns `btrfs`,
   * ~3 ms of this process's event loop on 2 cores, and waits for a commit). True when `target` is
   * a spare that the source's `prepare` readied (nothing of it is left to do).
   */
  async clone(source: string, target: string, options: { replenishLater?: boolean } = {}): Promise<boolean> {
    const prepared = this.wanted.get(source)?.prepare !== undefined;
    const taken = await this.take(source, target);
    if (!taken) await runCommand(['btrfs', 'subvolume', 'snapshot', source, target]);
    if (options.replenishLater !== true) this.replenish(source);
    return taken && prepared;
  }

  /**
   * From now on a spare of `source` is kept ready: one is made now (in the background) unless one
   * is. `prepare` does to each new spare, before a create may take it, what every create from it
   * would otherwise do first (a template root's /workspace, its page cache), off the create's path.
   */
  keep(source: string, prepare?: Prepare, depth = 1): void {
    const before = this.wanted.get(source);
    const wanted = { prepare, depth: Math.max(1, Math.min(depth, MAX_SPARE_DEPTH)) };
    this.wanted.set(source, wanted);
    // Kept already with as many (each create from a template asks again, before it takes a
    // spare): only the most recent now. A make begun here would find that spare and do nothing.
    if (before !== undefined && before.depth >= wanted.depth && this.kept.has(source)) this.touch(source);
    else this.replenish(source);
  }

  /**
   * After a create from `source` (which took its spare, or found none): a new one is made in the
   * background when the source is kept and none is ready or being made. A failure leaves no spare:
   * creates snapshot the source themselves.
   */
  replenish(source: string): void {
    // A create from it (here or by capsule-launch) makes it the most recently used.
    if (this.wanted.has(source)) this.touch(source);
    if (!this.kept.has(source)) return;
    // The make under way may be past the slot just taken: it runs again when it ends.
    if (this.making.has(source)) this.again.add(source);
    else this.startMake(source);
  }

  private startMake(source: string): void {
    const made = this.make(source)
      .catch(() => undefined)
      .finally(() => {
        this.making.delete(source);
        if (this.again.delete(source) && this.kept.has(source)) this.startMake(source);
      });
    this.making.set(source, made);
  }

  /** Deletes the spare of `source`, waiting for one being made; call before deleting the source. */
  async discard(source: string): Promise<void> {
    this.wanted.delete(source);
    await this.drop(source);
  }

  /** Resolves once no spare is being made or dropped. */
  async idle(): Promise<void> {
    while (this.making.size > 0 || this.dropping.size > 0) await Promise.all([...this.making.values(), ...this.dropping]);
  }

  /** How many sources have a spare kept (at most `maxSpares`). */
  get keptCount(): number {
    return this.kept.size;
  }

  /** Deletes every spare on the volume (this process's and any a crashed one left), once those being made are. */
  async clear(): Promise<void> {
    this.wanted.clear();
    this.kept.clear();
    this.again.clear();
    await this.idle();
    const entries = await readdir(this.dir).catch(() => [] as string[]);
    if (entries.length > 0) await this.deleteSubvolumes(entries.map((entry) => join(this.dir, entry)));
  }

  /** `source` becomes the most recently used kept source; the least recent past the bound loses its spare. */
  private touch(source: string): void {
    this.kept.delete(source);
    this.kept.add(source);
    while (this.kept.size > this.maxSpares) {
      const oldest = this.kept.values().next().value as string;
      const dropped = this.drop(oldest)
        .catch(() => undefined)
        .finally(() => this.dropping.delete(dropped));
      this.dropping.add(dropped);
    }
  }

  /** No spare of `source` is kept any more: the one being made is waited for, then deleted. */
  private async drop(source: string): Promise<void> {
    this.kept.delete(source);
    // A make that ends may begin its re-run (`again`) at once: wait for those too.
    while (this.making.has(source)) await this.making.get(source);
    // Kept again meanwhile (a create from it): its spares stay.
    if (this.kept.has(source)) return;
    const present: string[] = [];
    for (const slot of this.slotsOf(source, MAX_SPARE_DEPTH)) if (await pathExists(slot)) present.push(slot);
    if (present.length > 0) await this.deleteSubvolumes(present);
  }

  /** Makes each missing spare of `source`, one after another, while it stays kept. */
  private async make(source: string): Promise<void> {
    for (const spare of this.slotsOf(source)) {
      if (!this.kept.has(source)) return;
      if (await pathExists(spare)) continue;
      await mkdir(this.dir, { recursive: true, mode: 0o700 });
      // Made under a name of its own and renamed when whole: a create never takes a partial one.
      const partial = `${spare}.${randomBytes(4).toString('hex')}.making`;
      await runCommand(['btrfs', 'subvolume', 'snapshot', source, partial]);
      try {
        await this.wanted.get(source)?.prepare?.(partial);
        await rename(partial, spare);
      } catch (error) {
        await this.deleteSubvolumes([partial]);
        throw error;
      }
    }
  }
}
