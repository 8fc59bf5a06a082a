import type { Socket } from 'node:net';
import { SandboxError } from '../../errors/index.js';
import type { Denial } from './policy.js';

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
 * sandboxes' agent pipes). The reserve defaults to a quarter of the limit, at least 1024 (at
 * least half of a limit below 2048, so a small limit still leaves the proxy some).
 */
export function descriptorBudget(openFilesLimit: number, reserve?: number): number {
  const kept = reserve ?? Math.max(Math.ceil(openFilesLimit / 4), Math.min(1024, Math.floor(openFilesLimit / 2)));
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

/** The `rule` of refusals past a sandbox's concurrent-connection limit, and past the proxy's budget. */
export const CONCURRENCY_RULE = 'network.maxConcurrentConnections';
export const CAPACITY_RULE = 'proxy-capacity';
/** ... and when the proxy cannot record a sandbox's connection bound (`recordConnections` failed). */
export const RECORD_RULE = 'connection-record';

/** What the limits need to know of a sandbox: its limit and what it holds now. */
export interface LimitedSandbox {
  policy: { maxConcurrentConnections: number };
  /** Sandbox-side connections open now. */
  downstream: number;
  /** Upstream connections (and broker requests) open now. */
  upstream: number;
}

export interface ConnectionLimitsOptions {
  timeouts: EgressTimeouts;
  /** @default unbounded */
  maxDescriptors?: number;
}

/**
 * The proxy's connection accounting: each sandbox's `maxConcurrentConnections` (on its side and
 * upstream, so pipelined requests add up), the descriptor budget of all sandboxes together, and
 * the handshake timer of connections that have not named a destination yet.
 */
export class ConnectionLimits {
  readonly timeouts: EgressTimeouts;
  private readonly descriptors: DescriptorBudget;
  private readonly handshakes = new WeakMap<Socket, NodeJS.Timeout>();

  constructor(options: ConnectionLimitsOptions) {
    this.timeouts = options.timeouts;
    for (const [name, value] of Object.entries(this.timeouts)) {
      if (!Number.isInteger(value) || value <= 0) {
        throw new SandboxError('INVALID_ARGUMENT', `egress ${name} must be a positive whole number of milliseconds, got ${value}`, {
          details: { field: name, value },
          hint: 'Pass e.g. --egress-idle-timeout 300000 (five minutes).',
        });
      }
    }
    this.descriptors = new DescriptorBudget(options.maxDescriptors ?? Number.MAX_SAFE_INTEGER);
  }

  get capacity(): number {
    return this.descriptors.total;
  }

  descriptorUse(): { inUse: number; total: number } {
    return { inUse: this.descriptors.inUse, total: this.descriptors.total };
  }

  /**
   * Takes a sandbox-side connection in (`sandbox` undefined: an unknown source, which its handler
   * refuses), or returns why not: the sandbox holds its limit, or the proxy its budget. The
   * caller resets a refused one. Admitted, it is closed unless it names its destination
   * (`handshaken`) within the handshake timeout; `onClose` runs when it closes.
   */
  admit(socket: Socket, sandbox: LimitedSandbox | undefined): Denial | undefined {
    const limit = sandbox && sandbox.downstream >= sandbox.policy.maxConcurrentConnections ? this.concurrencyDenial(sandbox) : undefined;
    if (limit) return limit;
    if (!this.descriptors.tryTake()) return this.capacityDenial();
    if (sandbox) sandbox.downstream += 1;
    const timer = setTimeout(() => socket.resetAndDestroy(), this.timeouts.handshakeTimeoutMs).unref();
    this.handshakes.set(socket, timer);
    socket.once('close', () => {
      clearTimeout(timer);
      this.descriptors.give();
      if (sandbox) sandbox.downstream -= 1;
    });
    return undefined;
  }

  /** The connection named its destination: its handshake timer stops (idle timeouts apply from here). */
  handshaken(socket: Socket): void {
    const timer = this.handshakes.get(socket);
    if (timer) clearTimeout(timer);
    this.handshakes.delete(socket);
  }

  /**
   * Takes an upstream slot for an allowed connection or broker request: the release function
   * (idempotent; call it when the upstream closes), or the refusal.
   */
  claimUpstream(sandbox: LimitedSandbox): (() => void) | Denial {
    if (sandbox.upstream >= sandbox.policy.maxConcurrentConnections) return this.concurrencyDenial(sandbox);
    if (!this.descriptors.tryTake()) return this.capacityDenial();
    sandbox.upstream += 1;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      sandbox.upstream -= 1;
      this.descriptors.give();
    };
  }

  private concurrencyDenial(sandbox: LimitedSandbox): Denial {
    const max = sandbox.policy.maxConcurrentConnections;
    return {
      code: 'EGRESS_LIMIT',
      rule: CONCURRENCY_RULE,
      message: `concurrent connection limit ${max} reached: the sandbox holds ${max} open connections through the egress proxy; close idle ones, reuse them (HTTP keep-alive) or raise network.maxConcurrentConnections`,
    };
  }

  private capacityDenial(): Denial {
    return {
      code: 'EGRESS_LIMIT',
      rule: CAPACITY_RULE,
      message: `the egress proxy holds its maximum of ${this.descriptors.total} descriptors for all sandboxes; retry later, and close connections you do not use`,
    };
  }
}
