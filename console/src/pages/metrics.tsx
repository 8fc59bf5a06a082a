import { useEffect, useState } from 'preact/hooks';
import { json } from '../api.js';
import { Chart, type ChartSeries } from '../components/chart.js';
import { ErrorBox } from '../components/error-box.js';
import { bytes } from '../format.js';
import type { MetricsHistory, MetricsSample } from '../../../src/wire/index.js';

const COLORS = ['#2563eb', '#dc2626', '#16a34a', '#ca8a04', '#7c3aed', '#0891b2', '#db2777', '#65a30d', '#ea580c', '#475569'];

/** Per-minute rates of counters between consecutive samples (a restart's reset reads as 0). */
function rates(samples: MetricsSample[], read: (s: MetricsSample) => number): (number | null)[] {
  return samples.map((s, i) => {
    const previous = samples[i - 1];
    if (!previous) return null;
    const minutes = (Date.parse(s.timestamp) - Date.parse(previous.timestamp)) / 60_000;
    return minutes > 0 ? Math.max(0, read(s) - read(previous)) / minutes : null;
  });
}

function CapacityBar({ label, used, total, format }: { label: string; used: number; total: number; format: (n: number) => string }) {
  const share = total > 0 ? used / total : 0;
  return (
    <div class="capacity-row">
      <span class="capacity-label">{label}</span>
      <span class="bar">
        <span class={`fill ${share > 1 ? 'over' : share > 0.8 ? 'high' : ''}`} style={{ width: `${Math.min(100, share * 100)}%` }} />
      </span>
      <span>
        {format(used)} / {format(total)} ({(share * 100).toFixed(0)}%)
      </span>
    </div>
  );
}

/** The four operating metrics over the last hour and the host's capacity (GET /v1/admin/metrics). */
export function MetricsPage() {
  const [history, setHistory] = useState<MetricsHistory>();
  const [error, setError] = useState<unknown>();
  useEffect(() => {
    const load = () =>
      json<MetricsHistory>('/v1/admin/metrics')
        .then((h) => {
          setHistory(h);
          setError(undefined);
        })
        .catch(setError);
    void load();
    const timer = setInterval(() => void load(), 10_000);
    return () => clearInterval(timer);
  }, []);
  if (!history) return <section><h2>Metrics</h2>{error ? <ErrorBox error={error} /> : <p class="muted">Loading…</p>}</section>;
  const { samples, capacity } = history;
  const xs = samples.map((s) => Date.parse(s.timestamp) / 1000);
  const createKeys = [...new Set(samples.flatMap((s) => s.creates.map((c) => `${c.template} · ${c.backend} · ${c.poolWarm ? 'warm pool' : 'cold'}`)))];
  const createSeries: ChartSeries[] = createKeys.flatMap((key, i) => [
    { label: `${key} p50`, color: COLORS[i % COLORS.length]! },
    { label: `${key} p95`, color: COLORS[i % COLORS.length]!, dashed: true },
  ]);
  const createData = createKeys.flatMap((key) =>
    (['p50', 'p95'] as const).map((q) => samples.map((s) => s.creates.find((c) => `${c.template} · ${c.backend} · ${c.poolWarm ? 'warm pool' : 'cold'}` === key)?.[q] ?? null)),
  );
  const resources = Object.keys(samples.at(-1)?.limitTerminations ?? {});
  const outcomes = Object.keys(samples.at(-1)?.artifactDeliveries ?? {});
  const last = samples.at(-1);
  return (
    <section>
      <div class="row page-head">
        <h2>Metrics</h2>
        <span class="muted">
          last {Math.round((history.intervalMs * samples.length) / 60_000)} min, a sample every {history.intervalMs / 1000}s; create percentiles over {history.windowMs / 60_000} min
        </span>
      </div>
      <ErrorBox error={error} />
      <div class="charts">
        <Chart
          title="Create duration by template and warm pool (s)"
          series={createSeries.length > 0 ? createSeries : [{ label: 'no creates yet', color: '#94a3b8' }]}
          data={[xs, ...(createData.length > 0 ? createData : [samples.map(() => null)])]}
          format={(v) => `${v.toFixed(3)}s`}
        />
        <Chart
          title="Limit terminations by resource (per minute)"
          series={resources.map((r, i) => ({ label: r, color: COLORS[i % COLORS.length]! }))}
          data={[xs, ...resources.map((r) => rates(samples, (s) => s.limitTerminations[r] ?? 0))]}
          format={(v) => v.toFixed(1)}
        />
        <Chart title="Blocked egress (per minute)" series={[{ label: 'blocked', color: '#dc2626' }]} data={[xs, rates(samples, (s) => s.egressBlocked)]} format={(v) => v.toFixed(1)} />
        <Chart
          title="Artifact deliveries by outcome (per minute)"
          series={outcomes.map((o, i) => ({ label: o, color: COLORS[i % COLORS.length]! }))}
          data={[xs, ...outcomes.map((o) => rates(samples, (s) => s.artifactDeliveries[o] ?? 0))]}
          format={(v) => v.toFixed(1)}
        />
      </div>
      <h3>Host capacity</h3>
      <div class="card capacity" data-testid="capacity">
        <CapacityBar label="CPU reserved" used={capacity.reserved.cpus} total={capacity.cpus} format={(n) => `${n}`} />
        <CapacityBar label="memory reserved" used={capacity.reserved.memoryBytes} total={capacity.memoryBytes} format={bytes} />
        <CapacityBar label="memory in use (host)" used={capacity.memoryBytes - capacity.memoryAvailableBytes} total={capacity.memoryBytes} format={bytes} />
        {capacity.disk && <CapacityBar label="data disk used" used={capacity.disk.totalBytes - capacity.disk.freeBytes} total={capacity.disk.totalBytes} format={bytes} />}
        {capacity.disk && <CapacityBar label="workspace limits" used={capacity.reserved.diskBytes} total={capacity.disk.totalBytes} format={bytes} />}
        <p class="muted">
          {capacity.sandboxes.live} live sandboxes ({capacity.sandboxes.running} running, {capacity.sandboxes.paused} paused) · load {capacity.load1} on {capacity.cpus} cores
          {last && ` · execs: ${Object.entries(last.execs).map(([k, v]) => `${k} ${v}`).join(', ')}`}
        </p>
      </div>
    </section>
  );
}
