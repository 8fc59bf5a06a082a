import { SandboxError } from '../errors/index.js';
import type { HostLimits } from '../host/host-limits.host.js';
import type { SandboxSpec } from '../sandbox-spec/index.js';
import type { AdmissionOptions } from './admission.js';
import type { Demand, LedgerTotals } from './admission-ledger.js';
import type { WorkspaceCapacity } from './disk-budget.js';

const GiB = 1024 ** 3;

/** The operator's admission settings (`capsule serve` flags; docs/operations.md). */
export interface AdmissionSettings {
  /** Live sandboxes on the server, every tenant's and the warm pool's (`--max-live-sandboxes`). @default 1000 */
  maxSandboxes?: number;
  /** Live sandboxes per tenant (`--max-sandboxes`; QUOTA_EXCEEDED). @default no limit in the engine; the server's is 20 */
  maxSandboxesPerTenant?: number;
  /**
   * How far the memory limits of live sandboxes may exceed the host's memory less the reserve
   * (`--memory-overcommit`): 1 never promises more than the host has. @default 1
   */
  memoryOvercommit?: number;
  /** Host memory kept for the server, the OS and the page cache (`--memory-reserve`). @default 2 GiB */
  memoryReserveBytes?: number;
  /** How far pids limits may exceed the host's task ids less the reserve (`--pids-overcommit`). @default 1 */
  pidsOvercommit?: number;
  /** Task ids kept for the host's own processes. @default 4096 */
  pidsReserve?: number;
  /** The longest `waitForCapacityMs` a create may ask for (`--max-capacity-wait`). @default 60000 */
  maxWaitMs?: number;
}

export const DEFAULT_ADMISSION = {
  maxSandboxes: 1000,
  memoryOvercommit: 1,
  memoryReserveBytes: 2 * GiB,
  pidsOvercommit: 1,
  pidsReserve: 4096,
  maxWaitMs: 60_000,
} as const;

/** What a sandbox of `spec` is promised, for admission. */
export function demandOf(tenantId: string, spec: SandboxSpec): Demand & { diskBytes: number } {
  return { tenantId, memoryBytes: spec.limits.memoryBytes, pids: spec.limits.pids, diskBytes: spec.limits.diskBytes };
}

/** The settings (defaults filled, each checked) against what the host has. */
export function admissionOptions(settings: AdmissionSettings = {}, host: HostLimits, disk: WorkspaceCapacity, outside: () => LedgerTotals): AdmissionOptions {
  const maxSandboxes = whole('maxSandboxes', settings.maxSandboxes ?? DEFAULT_ADMISSION.maxSandboxes, 1);
  const maxSandboxesPerTenant = whole('maxSandboxesPerTenant', settings.maxSandboxesPerTenant ?? Number.MAX_SAFE_INTEGER, 1);
  const memoryOvercommit = ratio('memoryOvercommit', settings.memoryOvercommit ?? DEFAULT_ADMISSION.memoryOvercommit);
  const reserveBytes = whole('memoryReserveBytes', settings.memoryReserveBytes ?? DEFAULT_ADMISSION.memoryReserveBytes, 0);
  const pidsOvercommit = ratio('pidsOvercommit', settings.pidsOvercommit ?? DEFAULT_ADMISSION.pidsOvercommit);
  const pidsReserve = whole('pidsReserve', settings.pidsReserve ?? DEFAULT_ADMISSION.pidsReserve, 0);
  return {
    bounds: {
      maxSandboxes,
      maxSandboxesPerTenant,
      memoryBytes: Math.floor(Math.max(0, host.memoryBytes - reserveBytes) * memoryOvercommit),
      pids: Math.floor(Math.max(0, host.pids - pidsReserve) * pidsOvercommit),
    },
    disk,
    outside,
    maxWaitMs: whole('maxWaitMs', settings.maxWaitMs ?? DEFAULT_ADMISSION.maxWaitMs, 0),
    memory: { hostBytes: host.memoryBytes, reserveBytes, overcommit: memoryOvercommit },
    pids: { host: host.pids, reserve: pidsReserve, overcommit: pidsOvercommit },
  };
}

function whole(field: string, value: number, minimum: number): number {
  if (!Number.isSafeInteger(value) || value < minimum) {
    throw new SandboxError('INVALID_ARGUMENT', `admission setting ${field} must be a whole number of at least ${minimum}, not ${value}`, {
      details: { field, value, minimum },
      hint: 'See docs/operations.md (admission control) for the capsule serve flags and their defaults.',
    });
  }
  return value;
}

function ratio(field: string, value: number): number {
  if (!(value >= 1) || !Number.isFinite(value)) {
    throw new SandboxError('INVALID_ARGUMENT', `admission setting ${field} must be a ratio of 1 or more, not ${value}`, {
      details: { field, value },
      hint: 'Use 1 (never promise more than the host has) or a larger ratio, e.g. 4.',
    });
  }
  return value;
}
