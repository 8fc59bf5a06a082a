import { useEffect, useRef, useState } from 'preact/hooks';
import { base64ToBytes, call, json, ndjson } from '../api.js';
import { bytes, duration } from '../format.js';
import { ErrorBox } from './error-box.js';
import type { ExecResult, ProcessInfo } from '../../../src/wire/index.js';

type EventWire = { type: 'start'; pid: number } | { type: 'stdout' | 'stderr'; data: string } | { type: 'exit'; result: ExecResult } | { type: 'warning'; warning: { message: string } };

interface Output {
  pid: number | undefined;
  argv: string[];
  text: string;
  result: ExecResult | undefined;
  warnings: string[];
}

/** How a finished process ended, naming the limit when one ended it. */
function ResultLine({ result }: { result: ExecResult }) {
  return (
    <div class={`result outcome-${result.outcome}`} data-testid="exec-result" data-outcome={result.outcome} data-limit={result.limit?.resource ?? ''}>
      <strong>{result.outcome}</strong>
      {result.exitCode !== null && ` · exit ${result.exitCode}`}
      {result.signal && ` · ${result.signal}`} · {duration(result.durationMs)} · peak memory {bytes(result.usage.memoryPeakBytes)}
      {result.limit && <div class="limit">{result.limit.message}</div>}
      {result.error && <div class="limit">{result.error.message}</div>}
      {(result.stdoutTruncated || result.stderrTruncated) && <div class="muted">output truncated (the full output is in the process log)</div>}
    </div>
  );
}

/** The processes of a sandbox: run a command and watch it live, or replay any listed one. */
export function Processes({ sandboxId, tenant, running }: { sandboxId: string; tenant: string | undefined; running: boolean }) {
  const base = `/v1/sandboxes/${sandboxId}/processes`;
  const [list, setList] = useState<ProcessInfo[]>([]);
  const [command, setCommand] = useState('');
  const [output, setOutput] = useState<Output>();
  const [error, setError] = useState<unknown>();
  const stream = useRef<AbortController | undefined>(undefined);

  const refresh = () =>
    json<{ processes: ProcessInfo[] }>(base, { tenant })
      .then((r) => setList(r.processes))
      .catch(setError);
  useEffect(() => {
    void refresh();
    const timer = setInterval(() => void refresh(), 3000);
    return () => {
      clearInterval(timer);
      stream.current?.abort();
    };
  }, [sandboxId, tenant]);

  /** Reads a process's events into the output panel. */
  const follow = async (response: Response, argv: string[], controller: AbortController) => {
    const decoder = new TextDecoder();
    let current: Output = { pid: undefined, argv, text: '', result: undefined, warnings: [] };
    setOutput(current);
    for await (const event of ndjson<EventWire>(response)) {
      if (controller.signal.aborted) return;
      if (event.type === 'start') current = { ...current, pid: event.pid };
      else if (event.type === 'stdout' || event.type === 'stderr') current = { ...current, text: current.text + decoder.decode(base64ToBytes(event.data), { stream: true }) };
      else if (event.type === 'warning') current = { ...current, warnings: [...current.warnings, event.warning.message] };
      else if (event.type === 'exit') current = { ...current, result: event.result };
      setOutput(current);
    }
    void refresh();
  };
  const open = (run: () => Promise<Response>, argv: string[]) => {
    stream.current?.abort();
    const controller = new AbortController();
    stream.current = controller;
    setError(undefined);
    run()
      .then((response) => follow(response, argv, controller))
      .catch((e: unknown) => {
        if (!controller.signal.aborted) setError(e);
      });
  };
  const runCommand = (event: Event) => {
    event.preventDefault();
    if (command.trim() === '') return;
    const argv = ['sh', '-c', command];
    open(() => call(base, { method: 'POST', body: { argv, tag: 'console' }, tenant, signal: stream.current?.signal }), argv);
    setTimeout(() => void refresh(), 300);
  };
  const replay = (process: ProcessInfo) => open(() => call(`${base}/${process.pid}/events`, { tenant, signal: stream.current?.signal }), process.argv);
  const signal = (process: ProcessInfo, name: string) =>
    call(`${base}/${process.pid}/signal`, { method: 'POST', body: { signal: name }, tenant })
      .then(() => refresh())
      .catch(setError);

  return (
    <div class="processes">
      <form class="row" onSubmit={runCommand}>
        <input
          class="grow mono"
          name="command"
          placeholder={running ? 'a command, run with sh -c (e.g. ls -la /workspace)' : 'the sandbox is not running'}
          value={command}
          disabled={!running}
          onInput={(e) => setCommand(e.currentTarget.value)}
        />
        <button type="submit" disabled={!running}>
          Run
        </button>
      </form>
      <ErrorBox error={error} onDismiss={() => setError(undefined)} />
      {output && (
        <div class="output-panel" data-testid="process-output">
          <div class="muted">
            {output.pid !== undefined ? `pid ${output.pid}: ` : ''}
            <span class="mono">{output.argv.join(' ')}</span> {output.result ? '' : '(running)'}
          </div>
          <pre class="output">{output.text}</pre>
          {output.warnings.map((w) => (
            <div class="warning" key={w}>
              {w}
            </div>
          ))}
          {output.result && <ResultLine result={output.result} />}
        </div>
      )}
      <table class="table">
        <thead>
          <tr>
            <th>pid</th>
            <th>command</th>
            <th>tag</th>
            <th>started</th>
            <th>state</th>
            <th />
          </tr>
        </thead>
        <tbody>
          {list.length === 0 && (
            <tr>
              <td colSpan={6} class="muted">
                No processes yet.
              </td>
            </tr>
          )}
          {[...list].reverse().map((p) => (
            <tr key={p.pid}>
              <td>{p.pid}</td>
              <td class="mono clip">{p.argv.join(' ')}</td>
              <td>{p.tag ?? ''}</td>
              <td>{new Date(p.startedAt).toLocaleTimeString()}</td>
              <td>{p.running ? <span class="badge state-running">running</span> : <span class="badge">ended</span>}</td>
              <td class="actions">
                <button class="small" onClick={() => replay(p)}>
                  Output
                </button>
                {p.running && (
                  <button class="small" onClick={() => void signal(p, 'SIGTERM')}>
                    Stop
                  </button>
                )}
              </td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}
