import { useEffect, useRef } from 'preact/hooks';
import uPlot from 'uplot';
import 'uplot/dist/uPlot.min.css';

export interface ChartSeries {
  label: string;
  color: string;
  /** Drawn dashed: a limit rather than a use. */
  dashed?: boolean;
}

export interface ChartProps {
  title: string;
  series: ChartSeries[];
  /** [x (unix seconds), ...one array per series]. */
  data: (number | null)[][];
  format?: (value: number) => string;
  height?: number;
}

/** A uPlot time chart; rebuilt when its series change, else only fed new data. */
export function Chart({ title, series, data, format, height = 180 }: ChartProps) {
  const box = useRef<HTMLDivElement>(null);
  const plot = useRef<uPlot | undefined>(undefined);
  const shape = series.map((s) => s.label).join('|');
  useEffect(() => {
    const element = box.current;
    if (!element) return;
    const axisValues = (_u: uPlot, values: number[]) => values.map((v) => (format ? format(v) : String(v)));
    plot.current = new uPlot(
      {
        width: Math.max(200, element.clientWidth),
        height,
        series: [{}, ...series.map((s) => ({ label: s.label, stroke: s.color, width: 1.5, ...(s.dashed ? { dash: [6, 4] } : {}), value: (_u: uPlot, v: number | null) => (v === null ? '–' : format ? format(v) : v.toFixed(2)) }))],
        axes: [{}, { values: axisValues, size: 70 }],
        scales: { y: { range: (_u, min, max) => [Math.min(0, min), max > 0 ? max * 1.1 : 1] } },
        cursor: { drag: { x: false, y: false } },
      },
      data as uPlot.AlignedData,
      element,
    );
    const resize = new ResizeObserver(() => plot.current?.setSize({ width: Math.max(200, element.clientWidth), height }));
    resize.observe(element);
    return () => {
      resize.disconnect();
      plot.current?.destroy();
      plot.current = undefined;
    };
    // Rebuilt when the set of series changes; data flows in below.
  }, [shape, height]);
  useEffect(() => {
    plot.current?.setData(data as uPlot.AlignedData);
  }, [data]);
  return (
    <figure class="chart" data-chart={title}>
      <figcaption>{title}</figcaption>
      <div ref={box} />
    </figure>
  );
}
