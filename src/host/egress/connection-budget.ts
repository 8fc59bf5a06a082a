/** How long the proxy waits on a connection. */
export interface EgressTimeouts {
  /**
   * From the proxy's accept until the connection names its destination (request head, CONNECT
   * line, TLS ClientHello); a connection that says nothing is closed. @default 10000
   */
  handshakeTimeoutMs: number;
  /**
   * A tunnel or request with no bytes either way for this long is closed (both sides; the
   * proxy's upstream connection too). @default 300000
   */
  idleTimeoutMs: number;
}

export const DEFAULT_EGRESS_TIMEOUTS: EgressTimeouts = { handshakeTimeoutMs: 10_000, idleTimeoutMs: 300_000 };

/**
 * The soft `Max open files` limit in the text of `/proc/self/limits`; undefined when it is
 * unlimited or absent.
 */
export function parseOpenFilesLimit(procLimits: string): number | undefined {
  const line = procLimits.split('\n').find((l) => l.startsWith('Max open files'));
  const soft = line?.slice('Max open files'.length).trim().split(/\s+/)[0];
  return soft !== undefined && /^\d+$/.test(soft) ? Number(soft) : undefined;
}

/**
 * Descriptors the proxy may hold across all sandboxes: the process's RLIMIT_NOFILE less a
 * reserve for everything else the server does (its API's accept() above all, SQLite, logs,
 * sandboxes' agent pipes). The reserve defaults to a quarter of the limit, at least 1024.
 */
export function descriptorBudget(openFilesLimit: number, reserve?: number): number {
  const kept = reserve ?? Math.max(1024, Math.ceil(openFilesLimit / 4));
  return Math.max(0, openFilesLimit - kept);
}

/** A count of the proxy's open descriptors (sandbox-side sockets and upstream sockets) against its budget. */
export class DescriptorBudget {
  readonly total: number;
  private used = 0;

  constructor(total: number) {
    this.total = total;
  }

  get inUse(): number {
    return this.used;
  }

  /** Takes one descriptor; false when the budget is spent (the caller refuses the connection). */
  tryTake(): boolean {
    if (this.used >= this.total) return false;
    this.used += 1;
    return true;
  }

  give(): void {
    this.used = Math.max(0, this.used - 1);
  }
}
