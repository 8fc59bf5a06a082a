import { useEffect, useRef, useState } from 'preact/hooks';
import { Terminal as XTerm } from '@xterm/xterm';
import { FitAddon } from '@xterm/addon-fit';
import '@xterm/xterm/css/xterm.css';
import { ApiError, base64ToBytes, call, json, ndjson } from '../api.js';
import { ErrorBox } from './error-box.js';
import type { ProcessInfo, SandboxInfo } from '../../../src/wire/index.js';

/** The tag that finds the console's terminal again after a reload (by any tab). */
export const TERMINAL_TAG = 'console-terminal';
const SHELL = ['sh', '-c', 'if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi'];

interface ExitEvent {
  type: 'exit';
  result: { outcome: string; exitCode: number | null; limit?: { message: string }; error?: { message: string } };
}
type ProcessEventWire = { type: 'start'; pid: number } | { type: 'stdout' | 'stderr'; data: string } | ExitEvent | { type: 'warning'; warning: { message: string } };

/**
 * xterm.js over the PTY process API: starts a shell (pty, stdin, background, tagged), streams
 * its events, sends keystrokes as stdin and sizes as resize calls. After a page reload it finds
 * the running shell by its tag and reattaches by pid: the event log replays what it printed.
 */
export function Terminal({ sandbox, tenant }: { sandbox: SandboxInfo; tenant: string | undefined }) {
  const box = useRef<HTMLDivElement>(null);
  const [status, setStatus] = useState('connecting');
  const [error, setError] = useState<unknown>();
  const [generation, setGeneration] = useState(0);
  const base = `/v1/sandboxes/${sandbox.sandboxId}/processes`;
  useEffect(() => {
    const element = box.current;
    if (!element) return;
    const controller = new AbortController();
    const term = new XTerm({ fontSize: 13, cursorBlink: true, scrollback: 5000, fontFamily: 'ui-monospace, Menlo, monospace' });
    const fit = new FitAddon();
    term.loadAddon(fit);
    term.open(element);
    fit.fit();
    let pid: number | undefined;
    // Keystrokes are sent in order, batched while a send is in flight.
    let pending = '';
    let sending = false;
    const flush = async () => {
      if (sending || pending === '' || pid === undefined) return;
      sending = true;
      const data = pending;
      pending = '';
      try {
        await call(`${base}/${pid}/stdin`, { method: 'POST', raw: new TextEncoder().encode(data), tenant, signal: controller.signal });
      } catch (e) {
        if (!controller.signal.aborted) setError(e);
      } finally {
        sending = false;
      }
      void flush();
    };
    term.onData((data) => {
      pending += data;
      void flush();
    });
    let resizeTimer: ReturnType<typeof setTimeout> | undefined;
    term.onResize(({ cols, rows }) => {
      clearTimeout(resizeTimer);
      resizeTimer = setTimeout(() => {
        if (pid !== undefined) void call(`${base}/${pid}/resize`, { method: 'POST', body: { cols, rows }, tenant }).catch(() => undefined);
      }, 150);
    });
    const observer = new ResizeObserver(() => fit.fit());
    observer.observe(element);

    const start = async (): Promise<number> => {
      const leftMs = Date.parse(sandbox.expiresAt) - Date.now();
      const body = { argv: SHELL, pty: { cols: term.cols, rows: term.rows }, stdin: true, background: true, tag: TERMINAL_TAG, env: { TERM: 'xterm-256color' } };
      try {
        // As long as the sandbox lives (within the operator's maximum of one process's wall clock).
        return (await json<{ pid: number }>(base, { method: 'POST', body: { ...body, timeoutMs: Math.max(1000, Math.min(leftMs, 3_600_000)) }, tenant })).pid;
      } catch (e) {
        if (e instanceof ApiError && e.body.details?.field === 'timeoutMs') return (await json<{ pid: number }>(base, { method: 'POST', body, tenant })).pid;
        throw e;
      }
    };
    const attach = async () => {
      const { processes } = await json<{ processes: ProcessInfo[] }>(base, { tenant, signal: controller.signal });
      const running = processes.filter((p) => p.running && p.tag === TERMINAL_TAG).at(-1);
      pid = running ? running.pid : await start();
      setStatus(running ? `reattached to pid ${pid}` : `pid ${pid}`);
      element.dataset.pid = String(pid);
      void call(`${base}/${pid}/resize`, { method: 'POST', body: { cols: term.cols, rows: term.rows }, tenant }).catch(() => undefined);
      const response = await call(`${base}/${pid}/events`, { tenant, signal: controller.signal });
      for await (const event of ndjson<ProcessEventWire>(response)) {
        if (event.type === 'stdout' || event.type === 'stderr') term.write(base64ToBytes(event.data));
        else if (event.type === 'warning') term.write(`\r\n\x1b[33m[${event.warning.message}]\x1b[0m\r\n`);
        else if (event.type === 'exit') {
          const why = event.result.limit?.message ?? event.result.error?.message ?? `exit ${event.result.exitCode ?? event.result.outcome}`;
          term.write(`\r\n\x1b[2m[the shell ended: ${why}]\x1b[0m\r\n`);
          setStatus('ended');
          pid = undefined;
        }
      }
    };
    attach().catch((e: unknown) => {
      if (controller.signal.aborted) return;
      setError(e);
      setStatus('not attached');
    });
    term.focus();
    return () => {
      controller.abort();
      observer.disconnect();
      clearTimeout(resizeTimer);
      term.dispose();
    };
  }, [sandbox.sandboxId, tenant, generation]);
  return (
    <div class="terminal-panel">
      <div class="row">
        <span class="muted" data-testid="terminal-status">
          Terminal: {status}
        </span>
        {status === 'ended' && <button onClick={() => setGeneration((g) => g + 1)}>New terminal</button>}
      </div>
      <ErrorBox error={error} onDismiss={() => setError(undefined)} />
      <div class="terminal" ref={box} data-testid="terminal" />
    </div>
  );
}
