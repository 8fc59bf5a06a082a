import { useEffect, useState } from 'preact/hooks';
import { ApiError, call, ndjson } from './api.js';
import type { FeedEventWire, SandboxInfo, UsageSample } from '../../src/wire/index.js';

export interface FeedState {
  sandboxes: Map<string, SandboxInfo>;
  usage: Map<string, UsageSample>;
  status: 'connecting' | 'live' | 'reconnecting';
  error: unknown;
  /** When the first snapshot arrived (performance.now()). */
  firstSnapshotAt: number | undefined;
}

/**
 * The live sandboxes over GET /v1/sandboxes/events (the operator: /v1/admin/sandboxes/events,
 * every tenant or one), reconnecting with a growing pause when the stream breaks. A fetch
 * stream, not EventSource: EventSource cannot send the Authorization header, and a key must
 * never go into a URL.
 */
export function useSandboxFeed(admin: boolean, tenant: string | undefined): FeedState & { merge(infos: SandboxInfo[]): void } {
  const [state, setState] = useState<FeedState>({ sandboxes: new Map(), usage: new Map(), status: 'connecting', error: undefined, firstSnapshotAt: undefined });
  useEffect(() => {
    const controller = new AbortController();
    let retryMs = 500;
    const path = admin ? '/v1/admin/sandboxes/events' : '/v1/sandboxes/events';
    const run = async () => {
      while (!controller.signal.aborted) {
        try {
          const response = await call(path, { query: admin ? { tenant } : {}, signal: controller.signal });
          for await (const event of ndjson<FeedEventWire>(response)) {
            retryMs = 500;
            apply(event);
          }
        } catch (error) {
          if (controller.signal.aborted) return;
          setState((s) => ({ ...s, status: 'reconnecting', error }));
          if (error instanceof ApiError && (error.status === 401 || error.status === 403)) return;
        }
        if (controller.signal.aborted) return;
        setState((s) => ({ ...s, status: 'reconnecting' }));
        await new Promise((resolve) => setTimeout(resolve, retryMs));
        retryMs = Math.min(retryMs * 2, 10_000);
      }
    };
    const apply = (event: FeedEventWire) => {
      setState((s) => {
        if (event.type === 'snapshot') {
          const sandboxes = new Map([...s.sandboxes].filter(([, info]) => info.endedAt !== undefined));
          for (const info of event.sandboxes) sandboxes.set(info.sandboxId, info);
          return { ...s, sandboxes, status: 'live', error: undefined, firstSnapshotAt: s.firstSnapshotAt ?? performance.now() };
        }
        if (event.type === 'sandbox') {
          const sandboxes = new Map(s.sandboxes);
          sandboxes.set(event.sandbox.sandboxId, event.sandbox);
          return { ...s, sandboxes };
        }
        if (event.type === 'usage') {
          const usage = new Map(s.usage);
          usage.set(event.sandboxId, event.sample);
          return { ...s, usage };
        }
        return s;
      });
    };
    void run();
    return () => controller.abort();
  }, [admin, tenant]);
  const merge = (infos: SandboxInfo[]) =>
    setState((s) => {
      const sandboxes = new Map(s.sandboxes);
      for (const info of infos) if (!sandboxes.has(info.sandboxId) || info.endedAt !== undefined) sandboxes.set(info.sandboxId, info);
      return { ...s, sandboxes };
    });
  return { ...state, merge };
}
