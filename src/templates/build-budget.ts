import { SandboxError } from '../errors/index.js';
import type { LayerStore } from './layer-store.host.js';
import { PUBLIC_OWNER } from './names.js';
import type { TemplateStore } from './template-store.js';

/** The disk quota as template builds charge it (structurally the server's TenantDiskQuota). */
export interface TemplateBudget {
  reserveStored(owner: { tenantId: string; quotaBytes?: number }, resource: 'templates', bytes: number): void;
  releaseStored(owner: { tenantId: string }, resource: 'templates', bytes: number): void;
  /** Bytes left in the owner's quota. */
  roomOf(owner: { tenantId: string; quotaBytes?: number }): number;
  /** Replaces each tenant's template use with what the layer store holds (`BuildBudget.usageByTenant`). */
  setTemplates(bytesByTenant: ReadonlyMap<string, number>): void;
}

/** A tenant's concurrent builds unless the operator says otherwise. */
export const DEFAULT_MAX_BUILDS_PER_TENANT = 2;

export interface BuildBudgetOptions {
  layers: LayerStore;
  store: TemplateStore;
  /** @default nothing is charged */
  budget?: TemplateBudget;
  /** @default DEFAULT_MAX_BUILDS_PER_TENANT */
  maxConcurrentBuildsPerTenant?: number;
  isInUse?: (layerKey: string) => boolean;
}

/**
 * What tenants' builds may take (docs/decisions/018-stored-disk-quota.md): a bounded number at
 * once each, and the layers they add, charged to their disk quota. The operator's builds (the
 * public owner) are neither bounded nor charged.
 */
export class BuildBudget {
  /** Builds running per tenant. */
  private readonly running = new Map<string, number>();

  constructor(private readonly options: BuildBudgetOptions) {}

  /** A slot among the owner's concurrent builds (QUOTA_EXCEEDED past the bound); release it once. */
  takeSlot(owner: string): () => void {
    if (owner === PUBLIC_OWNER) return () => undefined;
    const limit = this.options.maxConcurrentBuildsPerTenant ?? DEFAULT_MAX_BUILDS_PER_TENANT;
    const running = this.running.get(owner) ?? 0;
    if (running >= limit) {
      throw new SandboxError('QUOTA_EXCEEDED', `tenant ${owner} already runs ${running} of its ${limit} concurrent template builds`, {
        details: { resource: 'builds', limit, used: running },
        hint: 'Wait for a build to finish (or cancel one), then build again; the operator sets the bound (capsule serve --max-builds-per-tenant).',
      });
    }
    this.running.set(owner, running + 1);
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const left = (this.running.get(owner) ?? 1) - 1;
      if (left <= 0) this.running.delete(owner);
      else this.running.set(owner, left);
    };
  }

  /** The store a build publishes through: a tenant's owns its new layers and pays for them. */
  async layersFor(owner: string, quotaBytes: number | undefined): Promise<LayerStore> {
    const budget = this.options.budget;
    if (owner === PUBLIC_OWNER || !budget) return this.options.layers;
    // Start from what the store holds (a prune or another process may have freed some).
    await this.refresh();
    const payer = { tenantId: owner, ...(quotaBytes !== undefined ? { quotaBytes } : {}) };
    return this.options.layers.charged({
      owner,
      reserve: (bytes) => budget.reserveStored(payer, 'templates', bytes),
      release: (bytes) => budget.releaseStored(payer, 'templates', bytes),
      room: () => budget.roomOf(payer),
    });
  }

  /** Deletes what `built` published that nothing else needs, once the build's lease has ended. */
  async dropPublished(built: LayerStore): Promise<void> {
    if (built.published.length === 0) return;
    const mine = new Set(built.published);
    await this.collect((layer) => mine.has(layer.key));
  }

  /** Deletes the owner's layers that no template, build or live sandbox needs. */
  async dropUnused(owner: string): Promise<void> {
    await this.collect((layer) => layer.owner === owner);
  }

  private async collect(only: (layer: { key: string; owner?: string }) => boolean): Promise<void> {
    const isInUse = this.options.isInUse;
    await this.options.layers.collect({ roots: await this.options.store.layerRoots(), ...(isInUse ? { isInUse } : {}), only });
  }

  /**
   * Bytes of template layers each tenant is charged: the layers its templates stand on and the
   * ones its builds made that no template refers to yet (a build in progress, a failed build's
   * cache), each by what it added over its parent; layers under a public template are free.
   */
  async usageByTenant(): Promise<Map<string, number>> {
    const metas = new Map((await this.options.layers.metas()).map((meta) => [meta.key, meta]));
    const closure = (roots: Iterable<string>): Set<string> => {
      const seen = new Set<string>();
      for (const root of roots) for (let key: string | undefined = root; key !== undefined && !seen.has(key); key = metas.get(key)?.parent) seen.add(key);
      return seen;
    };
    const rootsByOwner = await this.options.store.layerRootsByOwner();
    const free = closure(rootsByOwner.get(PUBLIC_OWNER) ?? []);
    const referenced = closure([...rootsByOwner.values()].flatMap((roots) => [...roots]));
    const tenants = new Set([...rootsByOwner.keys(), ...[...metas.values()].flatMap((meta) => (meta.owner !== undefined ? [meta.owner] : []))]);
    tenants.delete(PUBLIC_OWNER);
    const usage = new Map<string, number>();
    for (const tenant of tenants) {
      const charged = closure(rootsByOwner.get(tenant) ?? []);
      for (const meta of metas.values()) if (meta.owner === tenant && !referenced.has(meta.key)) charged.add(meta.key);
      let bytes = 0;
      for (const key of charged) if (!free.has(key)) bytes += metas.get(key)?.addedBytes ?? 0;
      usage.set(tenant, bytes);
    }
    return usage;
  }

  /** Sets the budget's template use from the store (start-up, each build, removals, prune). */
  async refresh(): Promise<void> {
    if (this.options.budget) this.options.budget.setTemplates(await this.usageByTenant());
  }
}
