import { useEffect, useState } from 'preact/hooks';
import { json } from '../api.js';
import { bytes } from '../format.js';
import { Chart } from './chart.js';
import { ErrorBox } from './error-box.js';
import type { SandboxInfo, UsageSample } from '../../../src/wire/index.js';

/** CPU, memory against its limit and disk against its limit, from the server's bounded history. */
export function UsageCharts({ sandbox, tenant }: { sandbox: SandboxInfo; tenant: string | undefined }) {
  const [samples, setSamples] = useState<UsageSample[]>([]);
  const [error, setError] = useState<unknown>();
  useEffect(() => {
    const load = () =>
      json<{ samples: UsageSample[] }>(`/v1/sandboxes/${sandbox.sandboxId}/metrics`, { tenant })
        .then((r) => {
          setSamples(r.samples);
          setError(undefined);
        })
        .catch(setError);
    void load();
    const timer = setInterval(() => void load(), 5000);
    return () => clearInterval(timer);
  }, [sandbox.sandboxId, tenant]);
  const xs = samples.map((s) => Date.parse(s.timestamp) / 1000);
  const { memoryBytes, diskBytes } = sandbox.spec.limits;
  const last = samples.at(-1);
  return (
    <div class="usage">
      <ErrorBox error={error} />
      {last && (
        <p class="muted">
          Now: CPU {last.cpuUsedPct.toFixed(1)}% of {sandbox.spec.limits.cpus} · memory {bytes(last.memoryBytes)} of {bytes(memoryBytes)} · disk {bytes(last.diskBytes)} of {bytes(diskBytes)}
        </p>
      )}
      <div class="charts">
        <Chart title="CPU (% of the sandbox's cores)" series={[{ label: 'CPU %', color: '#2563eb' }]} data={[xs, samples.map((s) => s.cpuUsedPct)]} format={(v) => `${v.toFixed(0)}%`} />
        <Chart
          title="Memory against its limit"
          series={[
            { label: 'used', color: '#16a34a' },
            { label: 'peak', color: '#ca8a04' },
            { label: 'limit', color: '#dc2626', dashed: true },
          ]}
          data={[xs, samples.map((s) => s.memoryBytes), samples.map((s) => s.memoryPeakBytes), samples.map(() => memoryBytes)]}
          format={bytes}
        />
        <Chart
          title="Disk against its limit"
          series={[
            { label: 'workspace', color: '#7c3aed' },
            { label: 'limit', color: '#dc2626', dashed: true },
          ]}
          data={[xs, samples.map((s) => s.diskBytes), samples.map(() => diskBytes)]}
          format={bytes}
        />
      </div>
    </div>
  );
}
