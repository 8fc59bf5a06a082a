import type { SandboxCounters } from '../backends/backend.js';
import type { NetworkPolicy } from '../sandbox-spec/index.js';
import type { LimitHit } from '../wire/index.js';

const plural = (n: number): string => `${n} connection${n === 1 ? '' : 's'}`;

/**
 * The egress limit, when it ended an exec: the proxy refused connections during it (counters
 * `egressLimitHits` and, by cause, `egressConcurrencyHits` / `egressCapacityHits`) and the
 * program failed. A program that got a 429 or a reset and still exited 0 handled it; its
 * result stays `ok`. The cause named is, in order: the sandbox's concurrent-connection limit,
 * the proxy's capacity for all sandboxes, the lifetime connection count.
 */
export function egressLimitHit(
  before: SandboxCounters,
  after: SandboxCounters,
  network: Pick<NetworkPolicy, 'maxConnections' | 'maxConcurrentConnections'>,
  failed: boolean,
): LimitHit | undefined {
  const delta = (key: 'egressLimitHits' | 'egressConcurrencyHits' | 'egressCapacityHits'): number => (after[key] ?? 0) - (before[key] ?? 0);
  const refused = delta('egressLimitHits');
  if (refused <= 0 || !failed) return undefined;
  const concurrency = delta('egressConcurrencyHits');
  if (concurrency > 0) {
    const max = network.maxConcurrentConnections;
    return {
      resource: 'egress',
      limit: max,
      used: max,
      unit: 'count',
      message:
        `concurrent connection limit ${max} reached (${plural(concurrency)} refused with a reset or 429 while ${max} were open); ` +
        'close idle connections, reuse them (HTTP keep-alive) or raise network.maxConcurrentConnections.',
    };
  }
  const capacity = delta('egressCapacityHits');
  if (capacity > 0) {
    const total = after.egressCapacity ?? 0;
    return {
      resource: 'egress',
      limit: total,
      used: total,
      unit: 'count',
      message:
        `the egress proxy was at its capacity of ${total} connections for all sandboxes, or could not record connection counts on its data disk (${plural(capacity)} refused); ` +
        'this limit is the server\'s, not the sandbox\'s: retry later, or ask the operator to raise the open-files limit or free space on the data disk.',
    };
  }
  const max = network.maxConnections;
  return {
    resource: 'egress',
    limit: max,
    used: max,
    unit: 'count',
    message: `outbound connection limit ${max} reached (${plural(refused)} refused with 429 or reset); raise network.maxConnections or reuse connections.`,
  };
}
