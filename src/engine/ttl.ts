import type { LiveSandbox } from './sandbox-table.js';

/** Node timers hold at most ~24.8 days; a longer TTL re-arms when the first timer fires. */
const MAX_TIMER_MS = 2 ** 31 - 1;

/**
 * The TTL of each live sandbox as one unref'd timer. A paused sandbox whose `onTimeout` is
 * `pause` has its TTL suspended (no timer) until it is resumed.
 */
export class TtlTimers {
  constructor(
    private readonly now: () => number,
    /** The TTL of `entry` ran out (its expiresAt is in the past). */
    private readonly onExpire: (entry: LiveSandbox) => void,
  ) {}

  schedule(entry: LiveSandbox): void {
    this.clear(entry);
    if (entry.info.state === 'paused' && entry.info.spec.onTimeout === 'pause') return;
    const delay = Math.max(0, Date.parse(entry.info.expiresAt) - this.now());
    entry.timer = setTimeout(() => {
      if (Date.parse(entry.info.expiresAt) > this.now()) return this.schedule(entry);
      this.onExpire(entry);
    }, Math.min(delay, MAX_TIMER_MS));
    entry.timer.unref();
  }

  clear(entry: LiveSandbox): void {
    clearTimeout(entry.timer);
    entry.timer = undefined;
  }
}
