import type { EgressEvent, EgressLogEntry } from './egress-types.js';

export type { EgressLogEntry } from './egress-types.js';

export interface DenialLogOptions {
  write: (entry: EgressLogEntry) => void;
  /** How often repeats are summed into one line. @default 10000 */
  windowMs?: number;
  /**
   * Kinds (destination + rule) logged one by one per sandbox and window; denials of further kinds
   * are summed into one line per sandbox (a sandbox cycling through random names, as DNS
   * exfiltration attempts do, writes a bounded number of lines). @default 16
   */
  kindsPerSandbox?: number;
}

interface Kind {
  first: EgressEvent;
  repeats: number;
}

interface SandboxWindow {
  kinds: Map<string, Kind>;
  /** Denials of kinds past `kindsPerSandbox`, and the last of them. */
  overflow: number;
  overflowKinds: Set<string>;
  lastOverflow?: EgressEvent;
}

/** Distinct kinds counted in an overflow line; past it the count says "at least". */
const MAX_OVERFLOW_KINDS = 1024;

/**
 * Aggregates denied-egress log lines: the first denial of each sandbox + destination + rule is
 * written at once, its repeats are summed into one line per window ("N more denials of X in the
 * last T s"). 10,000 denials of one destination are two lines, not 10,000. Counting (metrics,
 * the sandbox's counters) is not done here and sees every denial.
 */
export class DenialLog {
  private readonly write: (entry: EgressLogEntry) => void;
  private readonly windowMs: number;
  private readonly kindsPerSandbox: number;
  private readonly sandboxes = new Map<string, SandboxWindow>();
  private timer: NodeJS.Timeout | undefined;

  constructor(options: DenialLogOptions) {
    this.write = options.write;
    this.windowMs = options.windowMs ?? 10_000;
    this.kindsPerSandbox = options.kindsPerSandbox ?? 16;
  }

  record(event: EgressEvent): void {
    let window = this.sandboxes.get(event.sandboxId);
    if (!window) {
      window = { kinds: new Map(), overflow: 0, overflowKinds: new Set() };
      this.sandboxes.set(event.sandboxId, window);
    }
    const key = `${event.kind}\0${event.destination}\0${event.rule}`;
    const kind = window.kinds.get(key);
    if (kind) {
      kind.repeats += 1;
    } else if (window.kinds.size < this.kindsPerSandbox) {
      window.kinds.set(key, { first: event, repeats: 0 });
      this.write(event);
    } else {
      window.overflow += 1;
      if (window.overflowKinds.size < MAX_OVERFLOW_KINDS) window.overflowKinds.add(key);
      window.lastOverflow = event;
    }
    this.timer ??= setTimeout(() => this.flush(), this.windowMs).unref();
  }

  /**
   * Writes the sums of the window that ended. A kind with repeats stays known into the next
   * window (a steady stream is one line per window); a quiet one is forgotten.
   */
  flush(): void {
    this.timer = undefined;
    const seconds = Math.round(this.windowMs / 1000);
    for (const [sandboxId, window] of this.sandboxes) {
      for (const [key, kind] of window.kinds) {
        if (kind.repeats === 0) {
          window.kinds.delete(key);
          continue;
        }
        const { destination, rule } = kind.first;
        const times = kind.repeats === 1 ? 'denial' : 'denials';
        this.write({ ...kind.first, repeated: kind.repeats, windowMs: this.windowMs, message: `${kind.repeats} more ${times} of ${destination} (${rule}) in the last ${seconds} s` });
        kind.repeats = 0;
      }
      if (window.overflow > 0 && window.lastOverflow) {
        const kinds = window.overflowKinds.size;
        const other = `${kinds}${kinds >= MAX_OVERFLOW_KINDS ? '+' : ''} other destination${kinds === 1 ? '' : 's'}`;
        this.write({
          ...window.lastOverflow,
          destination: `(${other})`,
          rule: 'many',
          repeated: window.overflow,
          windowMs: this.windowMs,
          message: `${window.overflow} denials of ${other} in the last ${seconds} s (the last: ${window.lastOverflow.destination}, ${window.lastOverflow.rule})`,
        });
        window.overflow = 0;
        window.overflowKinds.clear();
        delete window.lastOverflow;
      }
      if (window.kinds.size === 0) this.sandboxes.delete(sandboxId);
    }
    if (this.sandboxes.size > 0) this.timer = setTimeout(() => this.flush(), this.windowMs).unref();
  }

  /** Writes what is pending and stops the timer. */
  close(): void {
    if (this.timer) clearTimeout(this.timer);
    this.flush();
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    this.sandboxes.clear();
  }
}
