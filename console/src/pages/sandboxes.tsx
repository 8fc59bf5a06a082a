import { useEffect, useMemo, useState } from 'preact/hooks';
import { json } from '../api.js';
import { actions } from '../actions.js';
import { ConfirmDialog, type ConfirmRequest } from '../components/confirm.js';
import { ErrorBox } from '../components/error-box.js';
import { FEATURES } from '../features.js';
import { useSandboxFeed } from '../feed.js';
import { bytes, duration, LIVE_STATES } from '../format.js';
import { sandboxHref } from '../router.js';
import type { ConsoleSession } from '../session.js';
import { CreateForm } from './create-form.js';
import type { SandboxInfo, SandboxPage, UsageSample } from '../../../src/wire/index.js';

/** Ticks every second: ages and times left stay current between feed events. */
export function useNow(): number {
  const [now, setNow] = useState(Date.now());
  useEffect(() => {
    const timer = setInterval(() => setNow(Date.now()), 1000);
    return () => clearInterval(timer);
  }, []);
  return now;
}

function matches(info: SandboxInfo, text: string): boolean {
  if (text === '') return true;
  const haystack = [info.sandboxId, info.tenantId, info.spec.template ?? 'default', info.backend, ...Object.entries(info.metadata).map(([k, v]) => `${k}=${v}`)].join(' ').toLowerCase();
  return text.toLowerCase().split(/\s+/).every((word) => haystack.includes(word));
}

export function SandboxActions({ info, features, tenant, ask, onError }: { info: SandboxInfo; features: Set<string>; tenant: string | undefined; ask: (request: ConfirmRequest) => void; onError: (error: unknown) => void }) {
  const run = (work: () => Promise<unknown>) => () => void work().catch(onError);
  const live = LIVE_STATES.includes(info.state);
  if (!live) return null;
  return (
    <span class="actions">
      {info.state === 'running' && (
        <button class="small" onClick={run(() => actions.pause(info.sandboxId, tenant))}>
          Pause
        </button>
      )}
      {info.state === 'paused' && (
        <button class="small" onClick={run(() => actions.resume(info.sandboxId, tenant))}>
          Resume
        </button>
      )}
      {features.has(FEATURES.snapshotCreate) && info.state === 'running' && (
        <button class="small" onClick={run(() => actions.snapshot(info.sandboxId, tenant))}>
          Snapshot
        </button>
      )}
      {features.has(FEATURES.fork) && info.state === 'running' && (
        <button
          class="small"
          onClick={() => {
            const count = Number(prompt('How many forks?', '1') ?? '0');
            if (count > 0) run(() => actions.fork(info.sandboxId, count, tenant))();
          }}
        >
          Fork
        </button>
      )}
      <button
        class="small danger"
        data-testid="kill"
        onClick={() =>
          ask({
            title: `Kill sandbox ${info.sandboxId}?`,
            body: 'Its processes end and its files are removed; its record and audit trail stay.',
            action: 'Kill',
            run: () => actions.kill(info.sandboxId, tenant),
          })
        }
      >
        Kill
      </button>
    </span>
  );
}

function Usage({ sample, info }: { sample: UsageSample | undefined; info: SandboxInfo }) {
  if (!sample || info.state !== 'running') return <td colSpan={2} class="muted">–</td>;
  const memoryShare = sample.memoryBytes / info.spec.limits.memoryBytes;
  return (
    <>
      <td>{sample.cpuUsedPct.toFixed(1)}%</td>
      <td class={memoryShare > 0.8 ? 'bad' : ''}>
        {bytes(sample.memoryBytes)} / {bytes(info.spec.limits.memoryBytes)}
      </td>
    </>
  );
}

/** Every sandbox the key may see, live: the feed's snapshot, then its changes and usage. */
export function SandboxesPage({ session, features }: { session: ConsoleSession; features: Set<string> }) {
  const [tenantFilter, setTenantFilter] = useState('');
  const [stateFilter, setStateFilter] = useState('live');
  const [text, setText] = useState('');
  const [creating, setCreating] = useState(false);
  const [error, setError] = useState<unknown>();
  const [confirm, setConfirm] = useState<ConfirmRequest>();
  const admin = session.admin;
  const feedTenant = admin && tenantFilter !== '' ? tenantFilter : undefined;
  const feed = useSandboxFeed(admin, feedTenant);
  const now = useNow();

  // Ended sandboxes are not in the live feed: read them once when asked for.
  useEffect(() => {
    if (stateFilter === 'live') return;
    const path = admin ? '/v1/admin/sandboxes' : '/v1/sandboxes';
    json<SandboxPage>(path, { query: { state: 'killed,expired,failed', limit: 200, ...(admin && feedTenant ? { tenant: feedTenant } : {}) } })
      .then((page) => feed.merge(page.sandboxes))
      .catch(setError);
  }, [stateFilter, admin, feedTenant]);

  const rows = useMemo(
    () =>
      [...feed.sandboxes.values()]
        .filter((info) => (stateFilter === 'live' ? LIVE_STATES.includes(info.state) : stateFilter === 'all' ? true : info.state === stateFilter))
        .filter((info) => matches(info, text))
        .sort((a, b) => b.createdAt.localeCompare(a.createdAt)),
    [feed.sandboxes, stateFilter, text],
  );
  useEffect(() => {
    if (feed.firstSnapshotAt !== undefined && !performance.getEntriesByName('capsule:first-table').length) performance.mark('capsule:first-table');
  }, [feed.firstSnapshotAt]);

  const actingTenant = (info: SandboxInfo) => (admin && info.tenantId !== session.tenantId ? info.tenantId : undefined);
  return (
    <section>
      <div class="row page-head">
        <h2>Sandboxes</h2>
        <span class={`badge feed-${feed.status}`} data-testid="feed-status">
          {feed.status}
        </span>
        <span class="grow" />
        <button class="primary" onClick={() => setCreating(!creating)}>
          {creating ? 'Close' : 'New sandbox'}
        </button>
      </div>
      {creating && (
        <CreateForm
          features={features}
          tenant={feedTenant && feedTenant !== session.tenantId ? feedTenant : undefined}
          onCreated={(info) => {
            setCreating(false);
            location.hash = sandboxHref(info.sandboxId, 'overview', info.tenantId !== session.tenantId ? info.tenantId : undefined);
          }}
        />
      )}
      <div class="row filters">
        <select value={stateFilter} onChange={(e) => setStateFilter(e.currentTarget.value)} aria-label="state filter">
          <option value="live">live (starting, running, paused)</option>
          <option value="all">all, also ended</option>
          {['running', 'paused', 'killed', 'expired', 'failed'].map((s) => (
            <option key={s} value={s}>
              {s}
            </option>
          ))}
        </select>
        <input class="grow" placeholder="filter: id, template, backend, key=value…" value={text} onInput={(e) => setText(e.currentTarget.value)} aria-label="text filter" />
        {admin && <input placeholder="tenant (all when empty)" value={tenantFilter} onChange={(e) => setTenantFilter(e.currentTarget.value.trim())} aria-label="tenant filter" />}
      </div>
      <ErrorBox error={error ?? feed.error} onDismiss={() => setError(undefined)} />
      <table class="table" data-testid="sandbox-table" data-ready={feed.firstSnapshotAt !== undefined ? 'true' : 'false'}>
        <thead>
          <tr>
            <th>id</th>
            {admin && <th>tenant</th>}
            <th>state</th>
            <th>template</th>
            <th>backend</th>
            <th>age</th>
            <th>time left</th>
            <th>CPU</th>
            <th>memory</th>
            <th>metadata</th>
            <th />
          </tr>
        </thead>
        <tbody>
          {feed.firstSnapshotAt !== undefined && rows.length === 0 && (
            <tr>
              <td colSpan={11} class="muted">
                No sandboxes{stateFilter === 'live' ? ' running' : ''}. Create one with “New sandbox”.
              </td>
            </tr>
          )}
          {rows.map((info) => (
            <tr key={info.sandboxId} data-sandbox={info.sandboxId} data-tenant={info.tenantId}>
              <td class="mono">
                <a href={sandboxHref(info.sandboxId, 'overview', actingTenant(info))}>{info.sandboxId}</a>
              </td>
              {admin && <td>{info.tenantId}</td>}
              <td>
                <span class={`badge state-${info.state}`}>{info.state}</span>
              </td>
              <td>{info.spec.template ?? 'default'}</td>
              <td>{info.backend}</td>
              <td>{duration(now - Date.parse(info.createdAt))}</td>
              <td>{info.endedAt ? <span class="muted">{info.endReason ?? 'ended'}</span> : duration(Date.parse(info.expiresAt) - now)}</td>
              <Usage sample={feed.usage.get(info.sandboxId)} info={info} />
              <td>
                {Object.entries(info.metadata).map(([k, v]) => (
                  <span class="chip" key={k}>
                    {k}={v}
                  </span>
                ))}
              </td>
              <td>
                <SandboxActions info={info} features={features} tenant={actingTenant(info)} ask={setConfirm} onError={setError} />
              </td>
            </tr>
          ))}
        </tbody>
      </table>
      <ConfirmDialog
        request={confirm}
        onClose={(e) => {
          setConfirm(undefined);
          if (e) setError(e);
        }}
      />
    </section>
  );
}
