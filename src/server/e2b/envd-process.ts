import type { FastifyRequest } from 'fastify';
import type { ProcessEnd } from '../../engine/result.js';
import type { ProcessHandle } from '../../engine/types.js';
import type { AnyRoute, Authenticate, RouteResult } from '../route.js';
import type { SandboxAccess } from './access.js';
import { ConnectError, deadlineMs, serverStream } from './connect-protocol.js';
import type { E2bContext, PortConstraint } from './deps.js';
import { envdService, record, reply } from './envd-rpc.js';
import { E2B_HOME, E2B_USER, requestedUser } from './paths.js';

/** envd's `process.Process` service over the engine's processes. */

interface Selector {
  pid?: number;
  tag?: string;
}

const SIGNALS: Record<string, NodeJS.Signals> = {
  SIGNAL_SIGKILL: 'SIGKILL',
  SIGNAL_SIGTERM: 'SIGTERM',
  '9': 'SIGKILL',
  '15': 'SIGTERM',
};

function strings(value: unknown): Record<string, string> {
  if (!value || typeof value !== 'object') return {};
  return Object.fromEntries(Object.entries(value as Record<string, unknown>).filter((e): e is [string, string] => typeof e[1] === 'string'));
}

/** Go's ProcessState: `exit status N`, or `signal: killed` with exit code -1. */
export function endEvent(result: ProcessEnd): object {
  if (result.outcome === 'ok') return { exitCode: 0, exited: true, status: 'exit status 0' };
  if (result.outcome === 'exit_nonzero' && result.exitCode !== null) {
    const status = `exit status ${result.exitCode}`;
    return { exitCode: result.exitCode, exited: true, status, error: status };
  }
  const why = result.limit?.message ?? result.error?.message ?? (result.signal ? `signal: ${result.signal}` : 'the process ended abnormally');
  return { exitCode: result.exitCode ?? -1, exited: false, status: result.signal ? `signal: ${result.signal.replace(/^SIG/, '').toLowerCase()}` : why, error: why };
}

export function envdProcessRoutes(ctx: E2bContext, auth: Authenticate, constraints: PortConstraint): AnyRoute[] {
  const { engine } = ctx;
  /** Processes started with a pty: their output is reported as `pty` data. */
  const ptys = new WeakSet<ProcessHandle>();

  const find = (access: SandboxAccess, selectorValue: unknown): ProcessHandle => {
    const selector = record(selectorValue, 'process') as Selector;
    if (typeof selector.pid === 'number') return engine.getProcess(access.tenantId, access.sandboxId, selector.pid);
    if (typeof selector.tag === 'string') {
      const info = engine.listProcesses(access.tenantId, access.sandboxId).find((p) => p.running && p.tag === selector.tag);
      if (info) return engine.getProcess(access.tenantId, access.sandboxId, info.pid);
      throw new ConnectError('not_found', `no running process is tagged "${selector.tag}"`);
    }
    throw new ConnectError('invalid_argument', 'process.pid or process.tag is required');
  };

  async function* messages(handle: ProcessHandle, signal: AbortSignal): AsyncGenerator<object> {
    const pty = ptys.has(handle) || handle.isPty;
    for await (const event of handle.events(signal)) {
      if (event.type === 'start') yield { event: { start: { pid: event.pid } } };
      else if (event.type === 'stdout') yield { event: { data: { [pty ? 'pty' : 'stdout']: event.data.toString('base64') } } };
      else if (event.type === 'stderr') yield { event: { data: { stderr: event.data.toString('base64') } } };
      else if (event.type === 'exit') yield { event: { end: endEvent(event.result) } };
    }
  }

  /** A process's events as a Connect stream; a failure to open it ends the stream with its error. */
  const stream = (request: FastifyRequest, opened: Promise<ProcessHandle>, final?: Promise<{ type: string }>): RouteResult => ({
    kind: 'stream',
    ...(final ? { final } : {}),
    write: (reply) =>
      serverStream(request, reply, { keepalive: { event: { keepalive: {} } }, controller: new AbortController() }, async function* (signal) {
        yield* messages(await opened, signal);
      }),
  });

  const rpc = envdService('process.Process', auth, constraints);
  const json = reply;

  return [
    rpc(
      'process.start',
      'Start',
      (access, message, request) => {
        const user = requestedUser(request);
        const config = record(message.process, 'process');
        if (typeof config.cmd !== 'string' || config.cmd === '') throw new ConnectError('invalid_argument', 'process.cmd is required');
        const args = Array.isArray(config.args) ? config.args.map(String) : [];
        const size = (message.pty as { size?: { cols?: number; rows?: number } } | undefined)?.size;
        const cwd = typeof config.cwd === 'string' && config.cwd !== '' ? (config.cwd.startsWith('/') ? config.cwd : `${E2B_HOME}/${config.cwd}`) : undefined;
        const { spec } = engine.get(access.tenantId, access.sandboxId);
        // envd ends the process when the call's deadline passes; without one it runs until the sandbox ends.
        const maxMs = spec.limits.wallClockMs;
        // PWD keeps /home/user in `pwd` (the kernel resolves the symlink to /workspace).
        const effectiveCwd = cwd ?? spec.cwd;
        const opened = engine
          .startProcess(access.tenantId, access.sandboxId, {
            argv: [config.cmd, ...args],
            env: { PWD: effectiveCwd, ...strings(config.envs) },
            cwd: effectiveCwd,
            timeoutMs: Math.min(deadlineMs(request) ?? maxMs, maxMs),
            stdin: size ? true : message.stdin !== false,
            ...(size ? { pty: { cols: size.cols ?? 80, rows: size.rows ?? 24 } } : {}),
            ...(typeof message.tag === 'string' ? { tag: message.tag } : {}),
            // E2B's default user is "user": the template's own when the sandbox has a template.
            ...(user !== undefined && user !== E2B_USER ? { user } : {}),
          })
          .then((handle) => {
            if (size) ptys.add(handle);
            return handle;
          });
        const final = opened.then((handle) => handle.ended).then((result) => ({ type: 'exit', result }));
        return stream(request, opened, final);
      },
      (message) => {
        const config = (message.process ?? {}) as { cmd?: unknown; args?: unknown };
        return JSON.stringify([config.cmd, ...(Array.isArray(config.args) ? (config.args as unknown[]) : [])]);
      },
    ),
    rpc('process.connect', 'Connect', (access, message, request) => stream(request, Promise.resolve().then(() => find(access, message.process)))),
    rpc('process.list', 'List', (access) => {
      const processes = engine
        .listProcesses(access.tenantId, access.sandboxId)
        .filter((p) => p.running)
        .map((p) => ({ config: { cmd: p.argv[0] ?? '', args: p.argv.slice(1), envs: {}, cwd: p.cwd }, pid: p.pid, ...(p.tag ? { tag: p.tag } : {}) }));
      return json({ processes });
    }),
    rpc(
      'process.input',
      'SendInput',
      (access, body) => {
        const input = record(body.input, 'input') as { stdin?: string; pty?: string };
        find(access, body.process).writeStdin(Buffer.from(input.stdin ?? input.pty ?? '', 'base64'));
        return json({});
      },
      () => 'stdin',
    ),
    rpc('process.closeStdin', 'CloseStdin', (access, body) => {
      find(access, body.process).closeStdin();
      return json({});
    }),
    rpc(
      'process.signal',
      'SendSignal',
      (access, body) => {
        const signal = SIGNALS[String(body.signal)];
        if (!signal) throw new ConnectError('invalid_argument', `signal ${String(body.signal)} is not one of SIGNAL_SIGKILL, SIGNAL_SIGTERM`);
        find(access, body.process).signal(signal);
        return json({});
      },
      (body) => String(body.signal),
    ),
    rpc('process.update', 'Update', (access, body) => {
      const handle = find(access, body.process);
      const size = (body.pty as { size?: { cols?: number; rows?: number } } | undefined)?.size;
      if (size?.cols && size.rows) handle.resize(size.cols, size.rows);
      return json({});
    }),
    rpc('process.streamInput', 'StreamInput', () => {
      throw new ConnectError('unimplemented', 'StreamInput is a client stream (HTTP/2 only); use SendInput');
    }),
  ];
}
