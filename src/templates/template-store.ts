import { randomBytes } from 'node:crypto';
import { mkdir, readdir, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { withLock } from '../host/lock.host.js';
import { SandboxError } from '../errors/index.js';
import { jsonNames, jsonPath, readJson, readJsonNow, writeJsonAtomic } from './json-files.js';
import { checkOwner, isTemplateId, parseTemplateRef, PUBLIC_OWNER, templateNotFound } from './names.js';
import { isOwnerAlive } from './owner.js';
import type { BuildRecord, TemplateRecord } from './records.js';

/** A name's tags: tag → template id. */
interface NameIndex {
  name: string;
  tags: Record<string, string>;
}

type StoredTemplate = Omit<TemplateRecord, 'tags'>;

/** A build record as stored: with the process that runs it, so a crashed build can be told apart. */
type StoredBuild = BuildRecord & { runner?: string };

/**
 * Template and build records as JSON files under `<dataDir>/templates/<owner>/`, 0700 directories
 * and 0600 files, each written atomically (see writeJsonAtomic): a server and a local CLI read them
 * without a lock and never see half a record. Tag moves take a per-owner lock directory. Owners
 * are tenants or `_public`; every lookup is scoped: a tenant finds its own templates and the
 * public ones, never another tenant's. See docs/decisions/011-template-storage.md for why files.
 */
export class TemplateStore {
  readonly dir: string;

  constructor(dataDir: string) {
    this.dir = join(dataDir, 'templates');
  }

  private ownerDir(owner: string): string {
    return join(this.dir, checkOwner(owner));
  }

  private lock<T>(owner: string, fn: () => Promise<T>): Promise<T> {
    return withLock(join(this.ownerDir(owner), '.lock'), fn);
  }

  async ensure(): Promise<void> {
    await mkdir(this.dir, { recursive: true, mode: 0o700 });
  }

  /** A fresh template id (20 hex digits). */
  newId(): string {
    return randomBytes(10).toString('hex');
  }

  /**
   * Stores a template and points `tags` of its name at it. A template left with no tag by the move
   * is removed (its layers become garbage unless something else holds them).
   */
  async save(record: StoredTemplate, tags: string[]): Promise<TemplateRecord> {
    const dir = this.ownerDir(record.owner);
    await writeJsonAtomic(jsonPath(join(dir, 'templates'), record.id), record);
    return this.lock(record.owner, async () => {
      const index = (await readJson<NameIndex>(jsonPath(join(dir, 'names'), record.name))) ?? { name: record.name, tags: {} };
      const displaced = new Set<string>();
      for (const tag of tags) {
        const previous = index.tags[tag];
        if (previous !== undefined && previous !== record.id) displaced.add(previous);
        index.tags[tag] = record.id;
      }
      await writeJsonAtomic(jsonPath(join(dir, 'names'), record.name), index);
      await this.dropUntagged(record.owner, index, displaced);
      return { ...record, tags: tagsOf(index, record.id) };
    });
  }

  /**
   * The template `ref` (`name[:tag]` or a template id) names for `tenant`: its own first, then a
   * public one. Anything else, another tenant's included, is TEMPLATE_NOT_FOUND.
   */
  async resolve(tenant: string, ref: string): Promise<TemplateRecord> {
    const found = await this.find(tenant, ref);
    if (!found) throw templateNotFound(ref);
    return found;
  }

  async find(tenant: string, ref: string): Promise<TemplateRecord | undefined> {
    const owners = tenant === PUBLIC_OWNER ? [PUBLIC_OWNER] : [checkOwner(tenant), PUBLIC_OWNER];
    if (isTemplateId(ref)) {
      for (const owner of owners) {
        const record = await this.get(owner, ref);
        if (record) return record;
      }
      return undefined;
    }
    // On every create from a template: read synchronously (readJsonNow), the tenant's own name
    // index first, and the index found gives the tags (get would read it again).
    const { name, tag } = parseTemplateRef(ref);
    for (const owner of owners) {
      const index = readJsonNow<NameIndex>(jsonPath(join(this.ownerDir(owner), 'names'), name));
      const id = index?.tags[tag];
      if (index === undefined || id === undefined || !isTemplateId(id)) continue;
      const stored = readJsonNow<StoredTemplate>(jsonPath(join(this.ownerDir(owner), 'templates'), id));
      if (stored) return { ...stored, tags: tagsOf(index, id) };
    }
    return undefined;
  }

  /** One template of `owner` by id, with its current tags. */
  async get(owner: string, id: string): Promise<TemplateRecord | undefined> {
    if (!isTemplateId(id)) return undefined;
    const stored = await readJson<StoredTemplate>(jsonPath(join(this.ownerDir(owner), 'templates'), id));
    if (!stored) return undefined;
    const index = await readJson<NameIndex>(jsonPath(join(this.ownerDir(owner), 'names'), stored.name));
    return { ...stored, tags: index ? tagsOf(index, id) : [] };
  }

  /** The tenant's templates and the public ones (or only `owner`'s with `{ only: true }`). */
  async list(tenant: string, options: { only?: boolean } = {}): Promise<TemplateRecord[]> {
    const owners = tenant === PUBLIC_OWNER || options.only ? [checkOwner(tenant)] : [checkOwner(tenant), PUBLIC_OWNER];
    const records: TemplateRecord[] = [];
    for (const owner of owners) {
      for (const id of await jsonNames(join(this.ownerDir(owner), 'templates'))) {
        const record = await this.get(owner, id);
        if (record) records.push(record);
      }
    }
    return records.sort((a, b) => a.name.localeCompare(b.name) || b.createdAt.localeCompare(a.createdAt));
  }

  /** Removes one tag (`name:tag`), or with a bare name every tag of it; untagged templates go. */
  async remove(owner: string, ref: string): Promise<string[]> {
    const { name, tag, tagged } = parseTemplateRef(ref);
    const dir = this.ownerDir(owner);
    return this.lock(owner, async () => {
      const index = await readJson<NameIndex>(jsonPath(join(dir, 'names'), name));
      const tags = tagged ? [tag] : Object.keys(index?.tags ?? {});
      if (!index || tags.length === 0 || tags.some((t) => index.tags[t] === undefined)) throw templateNotFound(ref);
      const displaced = new Set(tags.map((t) => index.tags[t]!));
      for (const t of tags) delete index.tags[t];
      if (Object.keys(index.tags).length === 0) await rm(jsonPath(join(dir, 'names'), name), { force: true });
      else await writeJsonAtomic(jsonPath(join(dir, 'names'), name), index);
      return this.dropUntagged(owner, index, displaced);
    });
  }

  /** Deletes the records among `candidates` that no tag of `index` points at any more. */
  private async dropUntagged(owner: string, index: NameIndex, candidates: Set<string>): Promise<string[]> {
    const still = new Set(Object.values(index.tags));
    const removed: string[] = [];
    for (const id of candidates) {
      if (still.has(id)) continue;
      await rm(jsonPath(join(this.ownerDir(owner), 'templates'), id), { force: true });
      removed.push(id);
    }
    return removed;
  }

  /** Every template's layer, across all owners: the roots of layer garbage collection. */
  async layerRoots(): Promise<Set<string>> {
    const roots = new Set<string>();
    for (const owner of await this.owners()) {
      for (const id of await jsonNames(join(this.ownerDir(owner), 'templates'))) {
        const record = await readJson<StoredTemplate>(jsonPath(join(this.ownerDir(owner), 'templates'), id));
        if (record) roots.add(record.layer);
      }
    }
    return roots;
  }

  /** Each owner's template layers (the public owner's under PUBLIC_OWNER). */
  async layerRootsByOwner(): Promise<Map<string, Set<string>>> {
    const roots = new Map<string, Set<string>>();
    for (const owner of await this.owners()) {
      const own = new Set<string>();
      for (const id of await jsonNames(join(this.ownerDir(owner), 'templates'))) {
        const record = await readJson<StoredTemplate>(jsonPath(join(this.ownerDir(owner), 'templates'), id));
        if (record) own.add(record.layer);
      }
      roots.set(owner, own);
    }
    return roots;
  }

  private async owners(): Promise<string[]> {
    const entries = await readdir(this.dir).catch(() => [] as string[]);
    return entries.filter((e) => e === PUBLIC_OWNER || /^[a-z0-9][a-z0-9_-]{0,63}$/.test(e));
  }

  async saveBuild(record: BuildRecord, runner?: string): Promise<void> {
    const stored: StoredBuild = runner === undefined ? record : { ...record, runner };
    await writeJsonAtomic(jsonPath(join(this.ownerDir(record.owner), 'builds'), checkBuildId(record.id)), stored);
  }

  /** A build of the tenant's (never another tenant's); undefined when unknown. */
  async getBuild(tenant: string, id: string): Promise<BuildRecord | undefined> {
    if (!/^[0-9a-f-]{36}$/.test(id)) return undefined;
    const stored = await readJson<StoredBuild>(jsonPath(join(this.ownerDir(tenant), 'builds'), id));
    if (!stored) return undefined;
    const { runner: _runner, ...record } = stored;
    return record;
  }

  /**
   * Marks builds whose process died mid-way as failed, removes temps of dead writers, and drops
   * finished build records older than `keepBuildsMs` that no template refers to.
   */
  async reconcile(options: { keepBuildsMs?: number; now?: Date } = {}): Promise<string[]> {
    const removed: string[] = [];
    const now = (options.now ?? new Date()).getTime();
    const keepMs = options.keepBuildsMs ?? 7 * 24 * 3600_000;
    for (const owner of await this.owners()) {
      const dir = this.ownerDir(owner);
      for (const sub of ['templates', 'names', 'builds']) {
        for (const entry of await readdir(join(dir, sub)).catch(() => [] as string[])) {
          const temp = /\.json\.(.+)\.tmp$/.exec(entry);
          if (temp && !isOwnerAlive(temp[1]!)) {
            await rm(join(dir, sub, entry), { force: true });
            removed.push(`temp ${owner}/${sub}/${entry}`);
          }
        }
      }
      const referenced = new Set((await this.list(owner, { only: true })).map((t) => t.buildId));
      for (const id of await jsonNames(join(dir, 'builds'))) {
        const build = await readJson<StoredBuild>(jsonPath(join(dir, 'builds'), id));
        if (!build) continue;
        if (build.status === 'building' && (build.runner === undefined || !isOwnerAlive(`${build.runner}.x`))) {
          const error = { code: 'ABORTED', message: 'the build was interrupted: the process running it ended' };
          await writeJsonAtomic(jsonPath(join(dir, 'builds'), id), { ...build, status: 'error', finishedAt: new Date(now).toISOString(), error });
          removed.push(`build ${id} (interrupted)`);
        } else if (build.status !== 'building' && !referenced.has(id) && now - Date.parse(build.finishedAt ?? build.startedAt) > keepMs) {
          await rm(jsonPath(join(dir, 'builds'), id), { force: true });
          removed.push(`build ${id}`);
        }
      }
    }
    return removed;
  }
}

function tagsOf(index: NameIndex, id: string): string[] {
  return Object.keys(index.tags)
    .filter((tag) => index.tags[tag] === id)
    .sort();
}

function checkBuildId(id: string): string {
  if (!/^[0-9a-f-]{36}$/.test(id)) throw new SandboxError('INTERNAL', `not a build id: ${id}`);
  return id;
}
