import { SandboxError } from '../errors/index.js';

/**
 * Concurrent sandboxes per tenant. A create reserves its slot before the engine starts work, so
 * sandboxes still starting count and a burst of creates cannot overshoot the quota.
 */
export class TenantQuota {
  private readonly pending = new Map<string, number>();

  constructor(
    private readonly maxSandboxes: number,
    /** Sandboxes of the tenant in a live state (starting, running, paused). */
    private readonly countLive: (tenantId: string) => number,
  ) {}

  /**
   * Takes a slot or throws QUOTA_EXCEEDED; call the returned function once the create has ended
   * (the record then counts). While a create runs its record may count as well as its slot:
   * the check errs on the side of refusing, never of overshooting.
   */
  reserve(tenantId: string): () => void {
    const pending = this.pending.get(tenantId) ?? 0;
    const used = this.countLive(tenantId) + pending;
    if (used >= this.maxSandboxes) {
      throw new SandboxError('QUOTA_EXCEEDED', `tenant ${tenantId} already has ${used} of its ${this.maxSandboxes} concurrent sandboxes`, {
        details: { resource: 'sandboxes', limit: this.maxSandboxes, used },
        hint: 'Kill sandboxes you no longer need (DELETE /v1/sandboxes/{id}), or ask the operator to raise --max-sandboxes.',
      });
    }
    this.pending.set(tenantId, pending + 1);
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const left = (this.pending.get(tenantId) ?? 1) - 1;
      if (left <= 0) this.pending.delete(tenantId);
      else this.pending.set(tenantId, left);
    };
  }
}
