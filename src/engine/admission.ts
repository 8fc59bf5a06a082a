import { isSandboxError, SandboxError } from '../errors/index.js';
import type { VolumeCapacity } from '../host/volume.host.js';
import type { CapacityInfo } from '../wire/index.js';
import { AdmissionLedger, type AdmissionBounds, type Demand, type LedgerTotals } from './admission-ledger.js';
import type { WorkspaceCapacity } from './disk-budget.js';

export interface AdmissionOptions {
  bounds: AdmissionBounds;
  /** The workspace volume's promises (disk-budget.ts): a create's disk limit is checked there. */
  disk: WorkspaceCapacity;
  /** Held outside the ledger: the warm pools' sandboxes. */
  outside?: () => LedgerTotals;
  /** The longest `waitForCapacityMs` a create may ask for. */
  maxWaitMs: number;
  /** What the bounds were made of, for GET /v1/capacity. */
  memory: { hostBytes: number; reserveBytes: number; overcommit: number };
  pids: { host: number; reserve: number; overcommit: number };
}

/** A create admitted: what it holds until its sandbox is in the engine's table, or it fails. */
export interface Admitted {
  /** Gives back the disk limit promised on the volume; once, when the workspace goes. */
  releaseVolume: () => void;
  /** The create's sandbox has its id: what the create held is held under that id from now on. */
  settle: (sandboxId: string) => void;
  /** The create failed before its sandbox had an entry: everything it held goes. */
  cancel: () => void;
}

interface Waiter {
  demand: Demand & { diskBytes: number };
  capacity: VolumeCapacity;
  refusal: SandboxError;
  resolve(admitted: Admitted): void;
  reject(error: unknown): void;
  timer: NodeJS.Timeout;
  stop(): void;
}

/**
 * Admission control: a create is admitted only when the host can back it — a sandbox slot
 * (server and tenant), its memory and pids limits, its disk limit on the volume — or refused at
 * once (CAPACITY_EXHAUSTED, 503, Retry-After; the tenant's own quota QUOTA_EXCEEDED, 429). With
 * `waitMs` it waits, first come first served, for a sandbox to end, up to that long, and is then
 * refused with the same error. Nothing is made before admission.
 */
export class Admission {
  private readonly ledger: AdmissionLedger;
  private readonly waiters: Waiter[] = [];
  private pendingSeq = 0;
  private closed = false;

  constructor(private readonly options: AdmissionOptions) {
    this.ledger = new AdmissionLedger(options.bounds, options.outside);
  }

  /** Counts a live sandbox (created, recovered or reattached) under its id; once. */
  hold(sandboxId: string, demand: Demand): void {
    this.ledger.hold(sandboxId, demand);
  }

  /** A sandbox ended and its host resources are gone: its room goes to those waiting. */
  release(sandboxId: string): void {
    if (this.ledger.release(sandboxId)) this.wake();
  }

  /**
   * Throws the refusal `count` more sandboxes of the tenant would meet on the counts alone (the
   * tenant's quota, the server's slots): a fork checks every slot before it makes anything.
   */
  assertSlots(tenantId: string, count: number): void {
    const refusal = this.ledger.slotsRefusal(tenantId, count);
    if (refusal) throw refusal;
  }

  /** Creates waiting for room now. */
  get waiting(): number {
    return this.waiters.length;
  }

  /** Admits `demand` now, or within `waitMs` once room frees; else throws the refusal. */
  async admit(demand: Demand & { diskBytes: number }, options: { waitMs?: number; signal?: AbortSignal } = {}): Promise<Admitted> {
    const waitMs = options.waitMs ?? 0;
    if (!Number.isInteger(waitMs) || waitMs < 0 || waitMs > this.options.maxWaitMs) {
      throw new SandboxError('INVALID_ARGUMENT', `waitForCapacityMs must be a whole number of milliseconds from 0 to ${this.options.maxWaitMs}, not ${waitMs}`, {
        details: { field: 'waitForCapacityMs', value: waitMs, maximum: this.options.maxWaitMs },
        hint: `Ask for at most ${this.options.maxWaitMs} ms (the operator's --max-capacity-wait), or 0 to be refused at once.`,
      });
    }
    const capacity = await this.options.disk.measure();
    this.assertOpen();
    const outcome = this.tryAdmit(demand, capacity);
    if (!(outcome instanceof SandboxError)) return outcome;
    if (waitMs === 0) throw outcome;
    options.signal?.throwIfAborted();
    return new Promise<Admitted>((resolve, reject) => {
      const waiter: Waiter = {
        demand,
        capacity,
        refusal: outcome,
        resolve,
        reject,
        timer: setTimeout(() => this.giveUp(waiter, afterWaiting(waiter.refusal, waitMs)), waitMs),
        stop: () => options.signal?.removeEventListener('abort', onAbort),
      };
      const onAbort = () => this.giveUp(waiter, options.signal?.reason ?? new SandboxError('ABORTED', 'the create was cancelled while it waited for capacity'));
      options.signal?.addEventListener('abort', onAbort, { once: true });
      this.waiters.push(waiter);
    });
  }

  /** What is promised and what is free now, for `tenantId`. */
  async describe(tenantId: string): Promise<CapacityInfo> {
    const { bounds } = this.ledger;
    const used = this.ledger.totals();
    const volume = await this.options.disk.measure();
    const disk = this.options.disk.describe(volume);
    const tenantUsed = this.ledger.tenantCount(tenantId);
    return {
      sandboxes: { limit: bounds.maxSandboxes, committed: used.sandboxes, free: Math.max(0, bounds.maxSandboxes - used.sandboxes) },
      tenant: { tenantId, limit: bounds.maxSandboxesPerTenant, committed: tenantUsed, free: Math.max(0, bounds.maxSandboxesPerTenant - tenantUsed) },
      memory: { limitBytes: bounds.memoryBytes, committedBytes: used.memoryBytes, freeBytes: Math.max(0, bounds.memoryBytes - used.memoryBytes), ...this.options.memory },
      pids: { limit: bounds.pids, committed: used.pids, free: Math.max(0, bounds.pids - used.pids), ...this.options.pids },
      disk,
      waiting: this.waiters.length,
      maxWaitMs: this.options.maxWaitMs,
    };
  }

  /** Refuses those still waiting: the engine is closing. */
  close(): void {
    this.closed = true;
    for (const waiter of [...this.waiters]) this.giveUp(waiter, new SandboxError('SANDBOX_NOT_RUNNING', 'the engine is shutting down'));
  }

  /** The admission, or the refusal it meets now; synchronous, so two creates cannot both take the last room. */
  private tryAdmit(demand: Demand & { diskBytes: number }, capacity: VolumeCapacity): Admitted | SandboxError {
    const refusal = this.ledger.refusal(demand);
    if (refusal) return refusal;
    let releaseVolume: () => void;
    try {
      releaseVolume = this.options.disk.reserve(demand.diskBytes, capacity);
    } catch (error) {
      if (isSandboxError(error, 'CAPACITY_EXHAUSTED')) return error;
      throw error;
    }
    const key = `pending:${++this.pendingSeq}`;
    this.ledger.hold(key, demand);
    return {
      releaseVolume,
      settle: (sandboxId) => {
        this.ledger.hold(sandboxId, demand);
        this.ledger.release(key);
      },
      cancel: () => {
        releaseVolume();
        this.ledger.release(key);
        this.wake();
      },
    };
  }

  /** Room freed: waiters that fit now are admitted, oldest first; the others keep their place. */
  private wake(): void {
    for (const waiter of [...this.waiters]) {
      const outcome = this.tryAdmit(waiter.demand, waiter.capacity);
      if (outcome instanceof SandboxError) {
        waiter.refusal = outcome;
        continue;
      }
      this.remove(waiter);
      waiter.resolve(outcome);
    }
  }

  private giveUp(waiter: Waiter, error: unknown): void {
    if (!this.remove(waiter)) return;
    waiter.reject(error);
  }

  private remove(waiter: Waiter): boolean {
    const index = this.waiters.indexOf(waiter);
    if (index < 0) return false;
    this.waiters.splice(index, 1);
    clearTimeout(waiter.timer);
    waiter.stop();
    return true;
  }

  private assertOpen(): void {
    if (this.closed) throw new SandboxError('SANDBOX_NOT_RUNNING', 'the engine is shutting down');
  }
}

/** The refusal a create met when its wait ended, saying how long it waited. */
function afterWaiting(refusal: SandboxError, waitedMs: number): SandboxError {
  return new SandboxError(refusal.code, `${refusal.message} (after waiting ${waitedMs} ms for room)`, {
    details: { ...(refusal.details ?? {}), waitedMs },
    ...(refusal.hint !== undefined ? { hint: refusal.hint } : {}),
  });
}
