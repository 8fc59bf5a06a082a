import { useEffect, useState } from 'preact/hooks';
import { json } from '../api.js';
import { AuditTable } from '../components/audit-table.js';
import { ConfirmDialog, type ConfirmRequest } from '../components/confirm.js';
import { ErrorBox } from '../components/error-box.js';
import { Files } from '../components/files.js';
import { Processes } from '../components/processes.js';
import { Snapshots } from '../components/snapshots.js';
import { lazy } from '../components/lazy.js';
import { FEATURES } from '../features.js';
import { useSandboxFeed } from '../feed.js';
import { bytes, duration } from '../format.js';
import { sandboxHref } from '../router.js';
import type { ConsoleSession } from '../session.js';
import { SandboxActions, useNow } from './sandboxes.js';
import type { AuditRecord, SandboxInfo } from '../../../src/wire/index.js';

const Terminal = lazy(() => import('../components/terminal.js').then((m) => m.Terminal));
const UsageCharts = lazy(() => import('../components/usage.js').then((m) => m.UsageCharts));

function Overview({ info }: { info: SandboxInfo }) {
  const { limits, network } = info.spec;
  return (
    <div class="overview">
      <div class="cards">
        <div class="card">
          <h4>Limits</h4>
          <dl>
            <dt>CPUs</dt>
            <dd>{limits.cpus}</dd>
            <dt>memory</dt>
            <dd>{bytes(limits.memoryBytes)}</dd>
            <dt>disk</dt>
            <dd>{bytes(limits.diskBytes)}</dd>
            <dt>wall clock</dt>
            <dd>{duration(limits.wallClockMs)}</dd>
            <dt>pids</dt>
            <dd>{limits.pids}</dd>
          </dl>
        </div>
        <div class="card" data-testid="network-policy">
          <h4>Network policy</h4>
          <dl>
            <dt>mode</dt>
            <dd>{network.mode}</dd>
            <dt>allow</dt>
            <dd class="mono">{network.allow.length > 0 ? network.allow.join(', ') : '–'}</dd>
            <dt>handles</dt>
            <dd class="mono">{network.handles.length > 0 ? network.handles.join(', ') : '–'}</dd>
            <dt>max connections</dt>
            <dd>{network.maxConnections}</dd>
          </dl>
        </div>
        <div class="card">
          <h4>Lifecycle</h4>
          <dl>
            <dt>created</dt>
            <dd>{new Date(info.createdAt).toLocaleString()}</dd>
            <dt>expires</dt>
            <dd>{new Date(info.expiresAt).toLocaleString()}</dd>
            <dt>on timeout</dt>
            <dd>{info.spec.onTimeout}</dd>
            {info.pause && (
              <>
                <dt>paused</dt>
                <dd>
                  {info.pause.keepsMemory ? 'memory kept' : 'files only'}
                  {info.pause.survivesRestart ? ', survives a restart' : ''}
                </dd>
              </>
            )}
            {info.endReason && (
              <>
                <dt>ended</dt>
                <dd>{info.endReason}</dd>
              </>
            )}
          </dl>
        </div>
      </div>
      <h4>Spec</h4>
      <pre class="spec" data-testid="spec">
        {JSON.stringify(info.spec, null, 2)}
      </pre>
    </div>
  );
}

function SandboxAudit({ sandboxId, tenant }: { sandboxId: string; tenant: string | undefined }) {
  const [records, setRecords] = useState<AuditRecord[]>();
  const [error, setError] = useState<unknown>();
  useEffect(() => {
    json<{ records: AuditRecord[] }>(`/v1/sandboxes/${sandboxId}/audit`, { query: { order: 'desc', limit: 200 }, tenant })
      .then((r) => setRecords(r.records))
      .catch(setError);
  }, [sandboxId, tenant]);
  return (
    <>
      <ErrorBox error={error} />
      {records && <AuditTable records={records} showTenant={false} />}
    </>
  );
}

/** One sandbox: its spec and policy, terminal, processes, files, usage, snapshots and audit records. */
export function SandboxPage({ session, features, sandboxId, tab, tenant }: { session: ConsoleSession; features: Set<string>; sandboxId: string; tab: string; tenant: string | undefined }) {
  const [fetched, setFetched] = useState<SandboxInfo>();
  const [error, setError] = useState<unknown>();
  const [confirm, setConfirm] = useState<ConfirmRequest>();
  const [generation, setGeneration] = useState(0);
  const feed = useSandboxFeed(session.admin, session.admin ? (tenant ?? session.tenantId) : undefined);
  const now = useNow();
  useEffect(() => {
    json<SandboxInfo>(`/v1/sandboxes/${sandboxId}`, { tenant })
      .then(setFetched)
      .catch(setError);
  }, [sandboxId, tenant]);
  const live = feed.sandboxes.get(sandboxId);
  // The feed's state is at least as new as the first read (it is written after the records).
  const info = live ?? fetched;
  if (!info) return <section>{error ? <ErrorBox error={error} /> : <p class="muted">Loading {sandboxId}…</p>}</section>;
  const running = info.state === 'running';
  const tabs = ['overview', 'terminal', 'processes', 'files', 'usage', ...(features.has(FEATURES.snapshotList) ? ['snapshots'] : []), 'audit'];
  return (
    <section>
      <div class="row page-head">
        <a href="#/sandboxes">Sandboxes</a> /<h2 class="mono">{info.sandboxId}</h2>
        <span class={`badge state-${info.state}`} data-testid="sandbox-state">
          {info.state}
        </span>
        <span class="muted">
          {info.tenantId} · {info.backend} · {info.spec.template ?? 'default template'} · age {duration(now - Date.parse(info.createdAt))}
          {info.endedAt ? '' : ` · ${duration(Date.parse(info.expiresAt) - now)} left`}
        </span>
        <span class="grow" />
        <SandboxActions
          info={info}
          features={features}
          tenant={tenant}
          ask={setConfirm}
          onError={setError}
        />
      </div>
      {Object.keys(info.metadata).length > 0 && (
        <div class="row">
          {Object.entries(info.metadata).map(([k, v]) => (
            <span class="chip" key={k}>
              {k}={v}
            </span>
          ))}
        </div>
      )}
      <ErrorBox error={error} onDismiss={() => setError(undefined)} />
      <nav class="tabs">
        {tabs.map((t) => (
          <a key={t} href={sandboxHref(sandboxId, t, tenant)} class={t === tab ? 'active' : ''} data-tab={t}>
            {t}
          </a>
        ))}
      </nav>
      {tab === 'overview' && <Overview info={info} />}
      {tab === 'terminal' && (running ? <Terminal sandbox={info} tenant={tenant} /> : <p class="muted">The terminal works while the sandbox runs ({info.state}).</p>)}
      {tab === 'processes' && <Processes sandboxId={sandboxId} tenant={tenant} running={running} />}
      {tab === 'files' && <Files sandboxId={sandboxId} tenant={tenant} start={info.spec.cwd} running={running} />}
      {tab === 'usage' && <UsageCharts sandbox={info} tenant={tenant} />}
      {tab === 'snapshots' && <Snapshots sandboxId={sandboxId} tenant={tenant} generation={generation} />}
      {tab === 'audit' && <SandboxAudit sandboxId={sandboxId} tenant={tenant} />}
      <ConfirmDialog
        request={confirm}
        onClose={(e) => {
          setConfirm(undefined);
          setGeneration((g) => g + 1);
          if (e) setError(e);
        }}
      />
    </section>
  );
}
