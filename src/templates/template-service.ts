import { mkdir, readdir, readFile, rm } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { isSandboxError, SandboxError } from '../errors/index.js';
import type { NetworkPolicyInput } from '../sandbox-spec/index.js';
import { BuildSession } from './build-session.js';
import { checkBuildRequest, type TemplateBuildRequest } from './build-request.js';
import { executePlan } from './builder/execute.js';
import { planBuild, type BuildBase } from './builder/plan.js';
import { buildInstructions } from './dockerfile/instructions.js';
import type { BootstrapDebianOptions, BuildOptions, ImportImageOptions, JobOptions, PruneReport, TemplateServiceOptions } from './service-options.js';
import { aptSourceHosts } from './debian/apt-sources.js';
import { hostAptSources, runBootstrap } from './debian/bootstrap.host.js';
import { bootstrapPackages, checkSuite, TEMPLATE_USER } from './debian/mmdebstrap-args.js';
import { BuildContext } from './dockerfile/context.js';
import { bootstrapLayerKey, scratchLayerKey } from './keys.js';
import { LayerStore } from './layer-store.host.js';
import { checkOwner, parseTemplateRef, PUBLIC_OWNER, templateNotFound } from './names.js';
import { parseImageRef } from './oci/image-ref.js';
import { ensureImageConfig, type ImageToolContext } from './oci/image-tools.host.js';
import { exportTemplateImage } from './oci/export.host.js';
import { importImageLayer } from './oci/import.host.js';
import { RegistryCredentials } from './oci/registry-credentials.js';
import { ownedName } from './owner.js';
import type { BuildRecord, TemplateConfig, TemplateParent, TemplateRecord, TemplateSource } from './records.js';
import { TemplateStore } from './template-store.js';
import { dirBytes, pruneImageCache, reconcileBuildJobs } from './maintenance.host.js';
import { BuildBudget } from './build-budget.js';

export { DEFAULT_MAX_BUILDS_PER_TENANT, type TemplateBudget } from './build-budget.js';

/** The default template config of a bootstrapped Debian root. */
const DEBIAN_CONFIG: TemplateConfig = {
  env: { PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin', LANG: 'C.UTF-8' },
  workdir: TEMPLATE_USER.home,
  user: TEMPLATE_USER.name,
};

export type { BootstrapDebianOptions, BuildOptions, ImportImageOptions, PruneReport, TemplateServiceOptions } from './service-options.js';

/**
 * Templates: storage (LayerStore, TemplateStore) and the three ways to make one: a Debian
 * bootstrap, an OCI image import and a Dockerfile build. Each is a build with a record and a
 * streamed log; each either ends with a template record or leaves nothing of itself behind.
 * A template also goes out as an OCI image (pushTemplate).
 */
export class TemplateService {
  readonly store: TemplateStore;
  readonly layers: LayerStore;
  readonly credentials: RegistryCredentials;
  private readonly imagesDir: string;
  private readonly tempRoot: string;
  /** Tenants' builds: bounded in number, their layers charged to their disk quota. */
  private readonly bounds: BuildBudget;

  constructor(private readonly options: TemplateServiceOptions) {
    const dataDir = options.host.dataDir;
    this.store = new TemplateStore(dataDir);
    this.layers = new LayerStore(options.host.volume);
    this.bounds = new BuildBudget({ layers: this.layers, store: this.store, ...options });
    this.credentials = new RegistryCredentials(dataDir);
    this.imagesDir = join(dataDir, 'images');
    this.tempRoot = join(dataDir, 'build-tmp');
  }

  private get layout(): string {
    return join(this.imagesDir, 'oci');
  }

  async ensure(): Promise<void> {
    await this.options.host.ensure();
    await this.layers.ensure();
    await this.store.ensure();
    await mkdir(this.tempRoot, { recursive: true, mode: 0o700 });
    await mkdir(this.imagesDir, { recursive: true, mode: 0o700 });
    await ensureImageConfig(join(this.imagesDir, 'config'));
  }

  /** Bootstraps Debian with mmdebstrap into a new layer; the template runs as `user` in /home/user. */
  async bootstrapDebian(options: BootstrapDebianOptions): Promise<TemplateRecord> {
    const packages = bootstrapPackages(options.packages ?? []);
    return this.job(options, 'debian', async ({ session, tempDir, lease, layers }) => {
      const suite = checkSuite(options.suite ?? (await hostAptSources('-', tempDir)).hostSuite ?? 'stable');
      const paths = await this.options.host.ensure();
      const key = bootstrapLayerKey({ suite, packages });
      session.log.info('base', `bootstrapping Debian ${suite} with ${packages.join(', ')}`);
      const pending = await layers.createEmpty();
      try {
        await runBootstrap({ suite, packages, target: pending.root, tempDir, launcher: paths.launcher, cgroupPrefix: this.options.host.cgroupPrefix, onLine: (line) => session.log.info('base', line), signal: options.signal });
        options.signal?.throwIfAborted();
        await lease([key]);
        await layers.publish(pending, { key, source: 'debian', description: `debian ${suite}: ${packages.join(',')}` });
      } catch (error) {
        await layers.discard(pending);
        throw error;
      }
      session.record.steps.push({ step: 'base', instruction: `debian ${suite}`, key, cached: false });
      return { layer: key, config: DEBIAN_CONFIG, parent: { kind: 'debian', suite, packages } };
    });
  }

  /** Imports an OCI image (registry, layout or tarball) as a template with the image's config. */
  async importImage(options: ImportImageOptions): Promise<TemplateRecord> {
    const ref = this.imageRef(options.ref, options.allowHostPaths ?? false);
    return this.job(options, 'image', async ({ session, tempDir, lease, layers }) => {
      const context = await this.imageContext(ref, tempDir, (line) => session.log.info('base', line), options.signal);
      const image = await importImageLayer(ref, layers, this.layout, context, async (key) => (await lease([key]))[0]!);
      session.record.steps.push({ step: 'base', instruction: ref.display, key: image.key, cached: !image.pulled });
      return { layer: image.key, config: image.config, parent: { kind: 'image', ref: ref.display, digest: image.digest } };
    });
  }

  /**
   * One entry point for every kind of build (a server's and the CLI's): a Debian bootstrap, an
   * image import or a Dockerfile build, by `request.source.kind`. Resolves with the template's
   * record; rejects with a SandboxError of a stable code: INVALID_ARGUMENT (the request, a
   * Dockerfile line), TEMPLATE_NOT_FOUND (a FROM), IMAGE_NOT_FOUND, IMAGE_UNSUPPORTED,
   * REGISTRY_UNREACHABLE, REGISTRY_UNAUTHORIZED, BUILD_FAILED (a step; details.line, exitCode,
   * lastLines), UNIMPLEMENTED (a RUN without a step runner), ABORTED (the signal). In every
   * failure nothing of the build remains but its failed build record.
   */
  async buildTemplate(request: TemplateBuildRequest): Promise<TemplateRecord> {
    const { source, config } = checkBuildRequest(request);
    const job = {
      owner: request.owner,
      name: request.name,
      ...(request.tags ? { tags: request.tags } : {}),
      ...(request.onLog ? { onLog: request.onLog } : {}),
      ...(request.signal ? { signal: request.signal } : {}),
      ...(request.quotaBytes !== undefined ? { quotaBytes: request.quotaBytes } : {}),
    };
    const allowHostPaths = request.allowHostPaths ?? false;
    if (source.kind === 'debian') return this.bootstrapDebian({ ...job, ...source, config });
    if (source.kind === 'image') return this.importImage({ ...job, ref: source.ref, allowHostPaths, config });
    const { kind: _, ...dockerfile } = source;
    return this.build({ ...job, ...dockerfile, config, allowHostPaths });
  }

  /** Builds a Dockerfile (the subset in dockerfile/parse.ts) into a template, step by step, cached. */
  async build(options: BuildOptions): Promise<TemplateRecord> {
    const contextDir = resolve(options.contextDir);
    const { file, instructions } = await buildInstructions(contextDir, options);
    const owner = checkOwner(options.owner ?? PUBLIC_OWNER);
    return this.job(options, 'dockerfile', async ({ session, tempDir, lease, layers }) => {
      const network = options.network ?? (await this.aptNetwork(tempDir));
      let parent: TemplateParent = { kind: 'scratch' };
      const resolveBase = async (from: string, line: number): Promise<BuildBase> => {
        session.log.info('base', `FROM ${from}`);
        const base = await this.resolveBase(owner, from, line, file, { session, tempDir, lease, layers, signal: options.signal, allowHostPaths: options.allowHostPaths ?? false });
        parent = base.parent;
        return base;
      };
      const plan = await planBuild(instructions, { owner, context: new BuildContext(contextDir), buildArgs: options.buildArgs ?? {}, network, resolveBase, file, stepUser: options.stepUser ?? 'root' });
      session.record.steps.push({ step: 'base', instruction: `FROM ${plan.base.layer.slice(0, 12)}`, key: plan.fromKey, cached: true });
      const result = await executePlan({
        plan,
        layers,
        contextDir,
        log: session.log,
        lease,
        stepRunner: this.options.stepRunner,
        network,
        limits: options.limits,
        noCache: options.noCache ?? false,
        buildId: session.id,
        file,
        signal: options.signal,
      });
      session.record.steps.push(...result.steps);
      return { layer: result.layer, config: plan.config, parent };
    });
  }

  /** FROM: the tenant's (or a public) template first, then an image reference, or scratch. */
  private async resolveBase(owner: string, from: string, line: number, file: string, job: JobContext & { signal?: AbortSignal; allowHostPaths: boolean }): Promise<BuildBase> {
    if (from === 'scratch') {
      const key = scratchLayerKey();
      // The empty layer is everyone's: made uncharged, whoever needs it first.
      if (!(await job.lease([key]))[0]) {
        const pending = await this.layers.createEmpty();
        await this.layers.publish(pending, { key, source: 'scratch', description: 'scratch' }).catch(async (error: unknown) => {
          await this.layers.discard(pending);
          throw error;
        });
      }
      return { layer: key, config: { env: {}, workdir: '/', user: 'root' }, parent: { kind: 'scratch' } };
    }
    const template = isTemplateRefText(from) ? await this.store.find(owner, from) : undefined;
    if (template) {
      if (!(await job.lease([template.layer]))[0]) throw templateNotFound(from);
      return { layer: template.layer, config: template.config, parent: { kind: 'template', id: template.id, name: template.name } };
    }
    let ref;
    try {
      ref = this.imageRef(from, job.allowHostPaths);
    } catch (error) {
      const why = error instanceof SandboxError ? error.message : String(error);
      throw new SandboxError('TEMPLATE_NOT_FOUND', `${file}:${line}: FROM ${from}: no such template, and not an image reference (${why})`, {
        details: { file, line, step: 'base' },
        hint: 'List your templates with `capsule template ls`, or name an image as registry/name:tag.',
      });
    }
    const context = await this.imageContext(ref, job.tempDir, (l) => job.session.log.info('base', l), job.signal);
    const image = await importImageLayer(ref, job.layers, this.layout, context, async (key) => (await job.lease([key]))[0]!);
    return { layer: image.key, config: image.config, parent: { kind: 'image', ref: ref.display, digest: image.digest } };
  }

  private imageRef(text: string, allowHostPaths: boolean) {
    const ref = parseImageRef(text);
    if (ref.kind !== 'registry' && !allowHostPaths) {
      throw new SandboxError('PERMISSION_DENIED', `${ref.kind}: images are files on the Capsule host, which only the operator may import`, {
        details: { image: text },
        hint: 'Push the image to a registry and name it as registry/name:tag.',
      });
    }
    return ref;
  }

  private async imageContext(ref: ReturnType<typeof parseImageRef>, tempDir: string, onLine: (line: string) => void, signal?: AbortSignal): Promise<ImageToolContext> {
    const paths = await this.options.host.ensure();
    const authFile = ref.kind === 'registry' ? await this.credentials.authFileFor(ref.registry) : undefined;
    return {
      launcher: paths.launcher,
      cgroupPrefix: this.options.host.cgroupPrefix,
      configDir: join(this.imagesDir, 'config'),
      tempDir,
      ...(authFile ? { authFile } : {}),
      insecureRegistries: this.options.insecureRegistries ?? [],
      onLine,
      ...(signal ? { signal } : {}),
    };
  }

  /** The default build network: the hosts of the host's apt sources, nothing else. */
  private async aptNetwork(tempDir: string): Promise<NetworkPolicyInput> {
    const sources = await hostAptSources('-', tempDir).catch(() => undefined);
    const hosts = new Set<string>();
    for (const path of sources?.files ?? []) for (const host of aptSourceHosts(await readFile(path, 'utf8'))) hosts.add(host);
    return { mode: 'allowlist', allow: [...hosts].sort() };
  }

  /**
   * The frame of every build: a record and a log, a temp dir of its own, a lease that keeps its
   * layers from garbage collection until the template refers to them; afterwards the temp dir and
   * the lease go whatever happened.
   */
  private async job(options: JobOptions, source: TemplateSource, make: (job: JobContext) => Promise<{ layer: string; config: TemplateConfig; parent: TemplateParent }>): Promise<TemplateRecord> {
    const owner = checkOwner(options.owner ?? PUBLIC_OWNER);
    const { name, tag } = parseTemplateRef(options.name);
    const tags = [...new Set([tag, ...(options.tags ?? []).map((t) => parseTemplateRef(`${name}:${t}`).tag)])];
    await this.ensure();
    if (options.signal?.aborted) throw new SandboxError('ABORTED', `the build of ${name}:${tag} was cancelled before it started`);
    const releaseSlot = this.bounds.takeSlot(owner);
    try {
      const layers = await this.bounds.layersFor(owner, options.quotaBytes);
      return await this.runJob(options, source, { owner, name, tag, tags, layers }, make);
    } finally {
      releaseSlot();
      // What the tenant's layers hold now, read off the store (the build's, its cache, a quota hit's clean-up).
      if (owner !== PUBLIC_OWNER) await this.bounds.refresh();
    }
  }

  private async runJob(
    options: JobOptions,
    source: TemplateSource,
    target: { owner: string; name: string; tag: string; tags: string[]; layers: LayerStore },
    make: (job: JobContext) => Promise<{ layer: string; config: TemplateConfig; parent: TemplateParent }>,
  ): Promise<TemplateRecord> {
    const { owner, name, tag, tags, layers } = target;
    const session = new BuildSession(this.store, owner, `${name}:${tag}`, options.onLog);
    await session.start();
    const tempDir = join(this.tempRoot, ownedName());
    const leaseName = ownedName();
    try {
      await mkdir(tempDir, { mode: 0o700 });
      const made = await make({ session, tempDir, lease: (keys) => this.layers.lease(leaseName, keys), layers });
      options.signal?.throwIfAborted();
      session.log.info('finalize', `saving template ${name}:${tag}`);
      const size = (await this.layers.usage(made.layer)) ?? { referencedBytes: 0, exclusiveBytes: 0 };
      const record = await this.store.save({ id: this.store.newId(), owner, name, layer: made.layer, config: { ...made.config, ...options.config }, size, parent: made.parent, source, buildId: session.id, createdAt: new Date().toISOString() }, tags);
      await session.succeed(record.id);
      return record;
    } catch (error) {
      // Past the quota nothing of the build stays: the layers it published before go too.
      if (isSandboxError(error, 'QUOTA_EXCEEDED')) {
        await this.layers.release(leaseName);
        await this.bounds.dropPublished(layers);
      }
      // A cancel surfaces wherever the build was (AbortSignal's own error included): say so.
      const cancelled = options.signal?.aborted && !(error instanceof SandboxError && error.code === 'ABORTED');
      throw await session.fail(cancelled ? new SandboxError('ABORTED', `the build of ${name}:${tag} was cancelled`) : error);
    } finally {
      await rm(tempDir, { recursive: true, force: true });
      await this.layers.release(leaseName);
    }
  }

  /**
   * Pushes a template as a one-layer OCI image (oci/export.host.ts) to a registry, or for the
   * operator (`allowHostPaths`) to an `oci:`/`oci-archive:` path; skopeo's errors are classified
   * as an import's (REGISTRY_UNREACHABLE, REGISTRY_UNAUTHORIZED). Resolves with the manifest digest.
   */
  async pushTemplate(options: { owner: string; ref: string; dest: string; allowHostPaths?: boolean; onLog?: (line: string) => void; signal?: AbortSignal }): Promise<{ digest: string; dest: string }> {
    const template = await this.store.resolve(checkOwner(options.owner), options.ref);
    const target = this.imageRef(options.dest, options.allowHostPaths ?? false);
    if (target.kind === 'registry' && target.digest !== undefined) {
      throw new SandboxError('INVALID_ARGUMENT', `a push names a tag, not a digest: ${options.dest}`, { details: { field: 'dest' }, hint: 'Name it as registry/name:tag.' });
    }
    await this.ensure();
    const tempDir = join(this.tempRoot, ownedName());
    const leaseName = ownedName();
    try {
      await mkdir(tempDir, { mode: 0o700 });
      if (!(await this.layers.lease(leaseName, [template.layer]))[0]) throw templateNotFound(options.ref);
      const context = await this.imageContext(target, tempDir, options.onLog ?? (() => undefined), options.signal);
      // umoci reads a tree it may chmod (its unprivileged walker), which a read-only layer refuses:
      // it reads a writable copy-on-write snapshot instead, a pending layer that is never published.
      const copy = await this.layers.createFrom(template.layer);
      try {
        const digest = await exportTemplateImage({ root: copy.root, config: template.config, target, context });
        return { digest, dest: target.display };
      } finally {
        await this.layers.discard(copy);
      }
    } finally {
      await rm(tempDir, { recursive: true, force: true });
      await this.layers.release(leaseName);
    }
  }

  resolve(tenant: string, ref: string): Promise<TemplateRecord> {
    return this.store.resolve(tenant, ref);
  }

  list(tenant: string): Promise<TemplateRecord[]> {
    return this.store.list(tenant);
  }

  /** A template with the record of the build that made it (its log). */
  async inspect(tenant: string, ref: string): Promise<{ template: TemplateRecord; build?: BuildRecord }> {
    const template = await this.store.resolve(tenant, ref);
    return { template, build: await this.store.getBuild(template.owner, template.buildId) };
  }

  getBuild(tenant: string, buildId: string): Promise<BuildRecord | undefined> {
    return this.store.getBuild(tenant, buildId);
  }

  /**
   * Removes a tag (or every tag of a bare name) of the owner's. A tenant's own layers that no
   * template, build or live sandbox needs any more go at once (and its quota with them); the
   * operator's go at the next prune.
   */
  async remove(owner: string, ref: string): Promise<string[]> {
    const removed = await this.store.remove(owner, ref);
    if (owner !== PUBLIC_OWNER) {
      await this.bounds.dropUnused(owner);
      await this.bounds.refresh();
    }
    return removed;
  }

  /** Removes what no template, build or live sandbox needs: layers, image blobs, temps of dead processes. */
  async prune(): Promise<PruneReport> {
    await this.ensure();
    const removedTemps = await this.reconcile();
    const collected = await this.layers.collect({ roots: await this.store.layerRoots(), ...(this.options.isInUse ? { isInUse: this.options.isInUse } : {}) });
    const kept = new Set((await this.layers.list()).map((layer) => layer.key));
    const freedImageCacheBytes = await pruneImageCache(this.layout, kept);
    await this.bounds.refresh();
    return { removedLayers: collected.removed, freedLayerBytes: collected.freedBytes, freedImageCacheBytes, removedTemps };
  }

  /** Cleans up after dead processes (run at start-up and by prune). */
  async reconcile(): Promise<string[]> {
    await this.ensure();
    const removed = [...(await this.layers.reconcile()), ...(await this.store.reconcile())];
    removed.push(...(await reconcileBuildJobs(this.options.host.cgroupPrefix, this.tempRoot)));
    return removed;
  }

  /** Bytes of template layers each tenant is charged (see BuildBudget.usageByTenant). */
  diskUsageByTenant(): Promise<Map<string, number>> {
    return this.bounds.usageByTenant();
  }

  /** Sets the disk budget's template use from the layer store (the server calls it at start). */
  refreshBudget(): Promise<void> {
    return this.bounds.refresh();
  }

  /** Bytes on the volume held by layers (exclusive, summed) and by the image blob cache. */
  async diskUsage(): Promise<{ layers: number; layerBytes: number; imageCacheBytes: number }> {
    const layers = await this.layers.list();
    return { layers: layers.length, layerBytes: layers.reduce((sum, l) => sum + (l.exclusiveBytes ?? 0), 0), imageCacheBytes: await dirBytes(join(this.layout, 'blobs')) };
  }

  /** Build temp dirs of live processes (for leak checks). */
  async buildTemps(): Promise<string[]> {
    return readdir(this.tempRoot).catch(() => [] as string[]);
  }
}

interface JobContext {
  session: BuildSession;
  tempDir: string;
  lease: (keys: string[]) => Promise<boolean[]>;
  /** The layer store as this build publishes to it: a tenant's build owns and pays for its new layers. */
  layers: LayerStore;
}

/** `name[:tag]` syntax (a template can only be that); image references with a registry are not. */
function isTemplateRefText(text: string): boolean {
  try {
    parseTemplateRef(text);
    return true;
  } catch {
    return false;
  }
}
