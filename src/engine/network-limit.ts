import type { SandboxCounters } from '../backends/backend.js';
import type { LimitHit } from '../wire/index.js';

/**
 * The egress limit, when it ended an exec: the proxy refused connections past
 * `network.maxConnections` during it (counters `egressLimitHits`) and the program failed. A
 * program that got a 429 and still exited 0 handled it; its result stays `ok`.
 */
export function egressLimitHit(before: SandboxCounters, after: SandboxCounters, maxConnections: number, failed: boolean): LimitHit | undefined {
  const refused = (after.egressLimitHits ?? 0) - (before.egressLimitHits ?? 0);
  if (refused <= 0 || !failed) return undefined;
  return {
    resource: 'egress',
    limit: maxConnections,
    used: maxConnections,
    unit: 'count',
    message:
      `outbound connection limit ${maxConnections} reached (${refused} connection${refused === 1 ? '' : 's'} refused with 429 or reset); ` +
      'raise network.maxConnections or reuse connections.',
  };
}
