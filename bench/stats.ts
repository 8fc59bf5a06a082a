/** Small statistics and table helpers shared by the benchmarks. */
export interface Summary {
  name: string;
  n: number;
  p50Ms: number;
  p95Ms: number;
  minMs: number;
}

export function percentile(sorted: number[], p: number): number {
  if (sorted.length === 0) return Number.NaN;
  const index = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[index]!;
}

export function summarize(name: string, samples: number[]): Summary {
  const sorted = [...samples].sort((a, b) => a - b);
  return { name, n: sorted.length, p50Ms: percentile(sorted, 50), p95Ms: percentile(sorted, 95), minMs: sorted[0] ?? Number.NaN };
}

export function table(rows: Record<string, string | number>[]): string {
  if (rows.length === 0) return '';
  const keys = Object.keys(rows[0]!);
  const cell = (v: string | number): string => (typeof v === 'number' ? (Number.isInteger(v) ? String(v) : v.toFixed(2)) : v);
  const widths = keys.map((k) => Math.max(k.length, ...rows.map((r) => cell(r[k] ?? '').length)));
  const line = (values: string[]): string => `| ${values.map((v, i) => v.padEnd(widths[i]!)).join(' | ')} |`;
  return [line(keys), line(widths.map((w) => '-'.repeat(w))), ...rows.map((r) => line(keys.map((k) => cell(r[k] ?? ''))))].join('\n');
}

export async function timeIt(fn: () => Promise<unknown>): Promise<number> {
  const start = performance.now();
  await fn();
  return performance.now() - start;
}
