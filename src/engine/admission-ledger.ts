import { SandboxError } from '../errors/index.js';
import { formatBytes } from '../sandbox-spec/index.js';

/** What one sandbox is promised: its limits, as its spec says. */
export interface Demand {
  tenantId: string;
  memoryBytes: number;
  pids: number;
}

/** The server's bounds on what live sandboxes may be promised together (AdmissionOptions). */
export interface AdmissionBounds {
  /** Live sandboxes on this server, every tenant's and the warm pool's. */
  maxSandboxes: number;
  /** Live sandboxes per tenant (its quota: QUOTA_EXCEEDED, not the host's capacity). */
  maxSandboxesPerTenant: number;
  /** What the memory limits of live sandboxes may add up to: (host memory − reserve) × overcommit. */
  memoryBytes: number;
  /** What the pids limits of live sandboxes (and their launchers) may add up to. */
  pids: number;
}

/** Task ids a sandbox takes outside its own pids limit: its launcher (and supervisor, if any). */
export const PIDS_OUTSIDE_LIMIT = 2;

/** Seconds after which a refused create may find room: sandboxes come and go in seconds. */
export const COUNT_RETRY_AFTER_S = 5;

export interface LedgerTotals {
  sandboxes: number;
  memoryBytes: number;
  pids: number;
}

/**
 * The promises made to live sandboxes, by id (pending creates under a key of their own): counts,
 * memory limits and pids limits, kept as running totals. Pure arithmetic; `Admission` adds the
 * disk volume, the waiting queue and the clock.
 */
export class AdmissionLedger {
  private readonly held = new Map<string, Demand>();
  private readonly perTenant = new Map<string, number>();
  private total: LedgerTotals = { sandboxes: 0, memoryBytes: 0, pids: 0 };

  constructor(
    readonly bounds: AdmissionBounds,
    /** Held outside the ledger: the warm pools' sandboxes, made or not yet. */
    private readonly outside: () => LedgerTotals = () => ({ sandboxes: 0, memoryBytes: 0, pids: 0 }),
  ) {}

  /** What is promised now, the warm pools included. */
  totals(): LedgerTotals {
    const pools = this.outside();
    return { sandboxes: this.total.sandboxes + pools.sandboxes, memoryBytes: this.total.memoryBytes + pools.memoryBytes, pids: this.total.pids + pools.pids };
  }

  tenantCount(tenantId: string): number {
    return this.perTenant.get(tenantId) ?? 0;
  }

  has(key: string): boolean {
    return this.held.has(key);
  }

  /**
   * The refusal `demand` would meet now, or undefined when it fits: the tenant's quota first
   * (its own doing), then the host's sandbox count, memory and task ids.
   */
  refusal(demand: Demand): SandboxError | undefined {
    const slots = this.slotsRefusal(demand.tenantId, 1);
    if (slots) return slots;
    const { bounds } = this;
    const used = this.totals();
    if (used.memoryBytes + demand.memoryBytes > bounds.memoryBytes) {
      return exhausted(
        'memory',
        `the host cannot back a memory limit of ${formatBytes(demand.memoryBytes)} more: ${formatBytes(used.memoryBytes)} of the ${formatBytes(bounds.memoryBytes)} it can back are promised to live sandboxes`,
        { limitBytes: bounds.memoryBytes, usedBytes: used.memoryBytes, requestedBytes: demand.memoryBytes },
        '--memory-overcommit or --memory-reserve',
        'a smaller limits.memoryBytes',
      );
    }
    const pids = demand.pids + PIDS_OUTSIDE_LIMIT;
    if (used.pids + pids > bounds.pids) {
      return exhausted(
        'pids',
        `the host cannot back ${pids} more task ids (limits.pids ${demand.pids} and its launcher): ${used.pids} of the ${bounds.pids} it can back are promised to live sandboxes`,
        { limit: bounds.pids, used: used.pids, requested: pids },
        '--pids-overcommit, or raise kernel.pid_max',
        'a smaller limits.pids',
      );
    }
    return undefined;
  }

  /** The refusal `count` more sandboxes of the tenant meet on the counts alone, or undefined. */
  slotsRefusal(tenantId: string, count: number): SandboxError | undefined {
    const { bounds } = this;
    const tenantUsed = this.tenantCount(tenantId);
    if (tenantUsed + count > bounds.maxSandboxesPerTenant) {
      return new SandboxError('QUOTA_EXCEEDED', `tenant ${tenantId} already has ${tenantUsed} of its ${bounds.maxSandboxesPerTenant} concurrent sandboxes${count > 1 ? `: ${count} more do not fit` : ''}`, {
        details: { resource: 'sandboxes', limit: bounds.maxSandboxesPerTenant, used: tenantUsed, requested: count, retryAfterS: COUNT_RETRY_AFTER_S },
        hint: 'Kill sandboxes you no longer need (DELETE /v1/sandboxes/{id}), wait for one to end (waitForCapacityMs), or ask the operator to raise --max-sandboxes.',
      });
    }
    const used = this.totals().sandboxes;
    if (used + count > bounds.maxSandboxes) {
      return exhausted('sandboxes', `the server already runs ${used} of the ${bounds.maxSandboxes} sandboxes it admits${count > 1 ? `: ${count} more do not fit` : ''}`, { limit: bounds.maxSandboxes, used, requested: count }, '--max-live-sandboxes');
    }
    return undefined;
  }

  /** Counts `demand` under `key` (a sandbox id, or a pending create's key); once per key. */
  hold(key: string, demand: Demand): void {
    if (this.held.has(key)) return;
    this.held.set(key, demand);
    this.perTenant.set(demand.tenantId, this.tenantCount(demand.tenantId) + 1);
    this.total = { sandboxes: this.total.sandboxes + 1, memoryBytes: this.total.memoryBytes + demand.memoryBytes, pids: this.total.pids + demand.pids + PIDS_OUTSIDE_LIMIT };
  }

  /** Gives back what `key` held; false when it held nothing. */
  release(key: string): boolean {
    const demand = this.held.get(key);
    if (!demand) return false;
    this.held.delete(key);
    const left = this.tenantCount(demand.tenantId) - 1;
    if (left <= 0) this.perTenant.delete(demand.tenantId);
    else this.perTenant.set(demand.tenantId, left);
    this.total = { sandboxes: this.total.sandboxes - 1, memoryBytes: this.total.memoryBytes - demand.memoryBytes, pids: this.total.pids - demand.pids - PIDS_OUTSIDE_LIMIT };
    return true;
  }
}

function exhausted(resource: string, message: string, figures: Record<string, number>, operatorFlag: string, smaller?: string): SandboxError {
  return new SandboxError('CAPACITY_EXHAUSTED', message, {
    details: { resource, ...figures, retryAfterS: COUNT_RETRY_AFTER_S },
    hint: `Retry once sandboxes have ended (see Retry-After), or pass waitForCapacityMs to wait for room${smaller ? `, or ask for ${smaller}` : ''}; the operator can raise ${operatorFlag} (capsule serve).`,
  });
}
