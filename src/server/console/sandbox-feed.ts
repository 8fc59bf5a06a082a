import type { SandboxRecordStore } from '../../store/index.js';
import type { SandboxInfo, UsageSample } from '../../wire/index.js';

/** What a feed line says: the live sandboxes at the start, then each change and usage reading. */
export type FeedEvent =
  | { type: 'snapshot'; sandboxes: SandboxInfo[] }
  | { type: 'sandbox'; sandbox: SandboxInfo }
  | { type: 'usage'; sandboxId: string; tenantId: string; sample: UsageSample }
  | { type: 'keepalive' };

/** Where the feed reads live sandboxes and their usage (the records and the engine). */
export interface FeedSource {
  listLive(): SandboxInfo[];
  usage(tenantId: string, sandboxId: string): Promise<UsageSample[]>;
}

export interface SandboxFeedOptions {
  /** How often the live sandboxes' usage is read while someone listens. @default 5000 */
  usageIntervalMs?: number;
  /** A line sent on a quiet feed, so a dead connection is noticed. @default 20000 */
  keepaliveMs?: number;
}

interface Subscriber {
  /** The tenant it sees, or null for every tenant (the operator). */
  tenantId: string | null;
  /** Pending lines by what they are about: a newer state of the same sandbox replaces the older. */
  pending: Map<string, FeedEvent>;
  wake: (() => void) | undefined;
}

/**
 * Live changes of sandboxes for the console (and any client): every record the engine writes
 * is passed on to the subscribers that may see it, after it is stored. A slow reader never
 * holds more than one pending state and one usage reading per sandbox.
 */
export class SandboxFeed {
  private readonly subscribers = new Set<Subscriber>();
  private source: FeedSource | undefined;
  private usageTimer: NodeJS.Timeout | undefined;
  private readonly usageIntervalMs: number;
  private readonly keepaliveMs: number;

  constructor(options: SandboxFeedOptions = {}) {
    this.usageIntervalMs = options.usageIntervalMs ?? 5000;
    this.keepaliveMs = options.keepaliveMs ?? 20_000;
  }

  /** The record store the engine writes to, passing every write on to the feed once stored. */
  observe(store: SandboxRecordStore): SandboxRecordStore {
    return {
      upsert: (info) => {
        store.upsert(info);
        this.changed(info);
      },
      findById: (sandboxId) => store.findById(sandboxId),
      listLive: () => store.listLive(),
      ...(store.listUnreadableLive ? { listUnreadableLive: () => store.listUnreadableLive!() } : {}),
    };
  }

  /** Binds the feed to the records and the engine (they are made after the feed). */
  connect(source: FeedSource): void {
    this.source = source;
  }

  changed(info: SandboxInfo): void {
    const sandbox = structuredClone(info);
    for (const subscriber of this.subscribers) {
      if (!sees(subscriber, info.tenantId)) continue;
      subscriber.pending.set(`sandbox:${info.sandboxId}`, { type: 'sandbox', sandbox });
      subscriber.wake?.();
    }
  }

  /** The feed of one tenant (or of all, `null`), from a snapshot of the live sandboxes on. */
  async *subscribe(tenantId: string | null, signal: AbortSignal): AsyncGenerator<FeedEvent> {
    const subscriber: Subscriber = { tenantId, pending: new Map(), wake: undefined };
    this.subscribers.add(subscriber);
    this.startUsage();
    try {
      // Registered first: a change between here and the snapshot is sent again, never missed.
      const live = this.source?.listLive() ?? [];
      yield { type: 'snapshot', sandboxes: live.filter((info) => sees(subscriber, info.tenantId)) };
      while (!signal.aborted) {
        if (subscriber.pending.size === 0) {
          const quiet = await this.wait(subscriber, signal);
          if (quiet) yield { type: 'keepalive' };
          continue;
        }
        const events = [...subscriber.pending.values()];
        subscriber.pending.clear();
        yield* events;
      }
    } finally {
      this.subscribers.delete(subscriber);
      if (this.subscribers.size === 0) this.stopUsage();
    }
  }

  close(): void {
    this.stopUsage();
  }

  /** Resolves when a line is pending (false), the feed was quiet for keepaliveMs (true) or aborted. */
  private wait(subscriber: Subscriber, signal: AbortSignal): Promise<boolean> {
    return new Promise((resolve) => {
      const done = (quiet: boolean): void => {
        clearTimeout(timer);
        signal.removeEventListener('abort', onAbort);
        subscriber.wake = undefined;
        resolve(quiet);
      };
      const onAbort = (): void => done(false);
      const timer = setTimeout(() => done(true), this.keepaliveMs);
      subscriber.wake = () => done(false);
      signal.addEventListener('abort', onAbort, { once: true });
    });
  }

  private startUsage(): void {
    if (this.usageTimer) return;
    this.usageTimer = setInterval(() => void this.readUsage(), this.usageIntervalMs);
    this.usageTimer.unref();
  }

  private stopUsage(): void {
    clearInterval(this.usageTimer);
    this.usageTimer = undefined;
  }

  /** One reading of every live sandboxes someone sees; one that ended meanwhile is skipped. */
  private async readUsage(): Promise<void> {
    const source = this.source;
    if (!source) return;
    const watched = source.listLive().filter((info) => info.state === 'running' && [...this.subscribers].some((s) => sees(s, info.tenantId)));
    await Promise.all(
      watched.map(async (info) => {
        const sample = (await source.usage(info.tenantId, info.sandboxId).catch(() => [])).at(-1);
        if (!sample) return;
        for (const subscriber of this.subscribers) {
          if (!sees(subscriber, info.tenantId)) continue;
          subscriber.pending.set(`usage:${info.sandboxId}`, { type: 'usage', sandboxId: info.sandboxId, tenantId: info.tenantId, sample });
          subscriber.wake?.();
        }
      }),
    );
  }
}

function sees(subscriber: Subscriber, tenantId: string): boolean {
  return subscriber.tenantId === null || subscriber.tenantId === tenantId;
}
