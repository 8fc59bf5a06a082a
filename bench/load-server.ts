/**
 * A `capsule serve` of its own for the load benchmark and the soak: a child process (so the
 * server's event loop is not the client's, as in a real deployment) on a fresh data directory,
 * stopped with SIGTERM and its directory removed at the end.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import WebSocket from 'ws';
import { HostEnvironment } from '../src/host/host-env.host.js';

const CAPSULE_BIN = fileURLToPath(new URL('../../bin/capsule.js', import.meta.url));

export interface BenchServer {
  url: string;
  apiKey: string;
  pid: number;
  dataDir: string;
  /** The server's resident memory now (VmRSS). */
  rssBytes(): Promise<number>;
  /**
   * The server's JS heap in use right after a full garbage collection (through its inspector,
   * so only with `inspect: true`): what it keeps, without the allocator's and the GC's timing.
   */
  heapAfterGcBytes(): Promise<number>;
  /** SIGTERM and wait for the exit (up to `timeoutMs`, then SIGKILL). */
  stop(timeoutMs?: number): Promise<void>;
  /** After stop: the workspace volume unmounted, the data directory removed (kept if anything is still mounted in it). */
  remove(): Promise<void>;
}

export interface BenchServerOptions {
  stderr?: (line: string) => void;
  /** Opens the server's inspector on loopback for heapAfterGcBytes. */
  inspect?: boolean;
}

/** Starts `capsule serve --port 0` with `flags`; resolves once it printed its URL. */
export async function startBenchServer(flags: readonly string[], options: BenchServerOptions = {}): Promise<BenchServer> {
  const dataDir = await mkdtemp(join(tmpdir(), 'capsule-load-'));
  const apiKey = `cap_${randomBytes(20).toString('hex')}`;
  const nodeFlags = options.inspect ? ['--inspect=127.0.0.1:0'] : [];
  const child = spawn(process.execPath, [...nodeFlags, CAPSULE_BIN, 'serve', '--port', '0', '--data-dir', dataDir, '--log-level', 'warn', ...flags], {
    env: { ...process.env, CAPSULE_API_KEY: apiKey },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  child.stderr?.setEncoding('utf8');
  // Node prints the inspector's address on stderr before any of the server runs; the URL comes on
  // stdout, whose order against stderr is not given, so each is awaited on its own pipe.
  const inspectorAddress = options.inspect ? printed(child, 'stderr', /Debugger listening on (ws:\/\/\S+)/, 'no inspector address') : undefined;
  inspectorAddress?.catch(() => undefined);
  child.stderr?.on('data', (chunk: string) => options.stderr?.(chunk));
  let inspector: Inspector | undefined;
  try {
    const url = await printed(child, 'stdout', /^URL: (\S+)$/m, 'no URL');
    if (inspectorAddress) inspector = await Inspector.open(await inspectorAddress);
    return {
      url,
      apiKey,
      pid: child.pid!,
      dataDir,
      rssBytes: async () => Number(/^VmRSS:\s+(\d+) kB/m.exec(await readFile(`/proc/${child.pid}/status`, 'utf8'))?.[1] ?? 0) * 1024,
      heapAfterGcBytes: async () => {
        if (!inspector) throw new Error('heapAfterGcBytes needs a server started with inspect: true');
        await inspector.call('HeapProfiler.collectGarbage');
        const answer = await inspector.call('Runtime.evaluate', { expression: 'process.memoryUsage().heapUsed', returnByValue: true });
        return Number((answer as { result?: { value?: unknown } }).result?.value);
      },
      stop: (timeoutMs = 120_000) => {
        inspector?.close();
        return stopChild(child, timeoutMs);
      },
      remove: () => removeDataDir(dataDir),
    };
  } catch (error) {
    inspector?.close();
    await stopChild(child, 10_000);
    await removeDataDir(dataDir);
    throw error;
  }
}

/** The first match of `pattern` (its group 1) on the child's `stream`; fails after 120 s or at its exit. */
function printed(child: ChildProcess, stream: 'stdout' | 'stderr', pattern: RegExp, what: string): Promise<string> {
  return new Promise((resolve, reject) => {
    let seen = '';
    const timer = setTimeout(() => done(new Error(`capsule serve printed ${what} within 120 s: ${seen}`)), 120_000);
    const onData = (chunk: Buffer | string): void => {
      if (seen.length < 64 * 1024) seen += chunk.toString();
      const match = pattern.exec(seen);
      if (match) done(undefined, match[1]);
    };
    const onExit = (code: number | null, signal: string | null): void => done(new Error(`capsule serve exited (${code ?? signal}) before it printed ${what}: ${seen}`));
    const done = (error: Error | undefined, value?: string): void => {
      clearTimeout(timer);
      child[stream]?.off('data', onData);
      child.off('exit', onExit);
      if (error) reject(error);
      else resolve(value!);
    };
    child[stream]?.setEncoding('utf8');
    child[stream]?.on('data', onData);
    child.once('exit', onExit);
  });
}

async function stopChild(child: ChildProcess, timeoutMs: number): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  child.kill('SIGTERM');
  const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
  await exited;
  clearTimeout(timer);
}

/** Unmounts the workspace volume and removes the directory, unless something is still mounted in it. */
async function removeDataDir(dataDir: string): Promise<void> {
  await new HostEnvironment({ dataDir }).volume.unmount().catch(() => undefined);
  const mounted = (await readFile('/proc/self/mountinfo', 'utf8')).split('\n').some((line) => (line.split(' ')[4] ?? '').startsWith(`${dataDir}/`));
  if (mounted) {
    process.stderr.write(`capsule bench: ${dataDir} still has mounts in it; left for a look\n`);
    return;
  }
  await rm(dataDir, { recursive: true, force: true });
}

/** A client of a Node inspector (Chrome DevTools Protocol over a WebSocket): one call at a time is enough here. */
class Inspector {
  private nextId = 1;
  private readonly waiting = new Map<number, { resolve: (value: unknown) => void; reject: (error: Error) => void }>();

  private constructor(private readonly socket: WebSocket) {
    socket.on('message', (data) => {
      const message = JSON.parse((data as Buffer).toString('utf8')) as { id?: number; result?: unknown; error?: { message: string } };
      const waiter = message.id === undefined ? undefined : this.waiting.get(message.id);
      if (!waiter) return;
      if (message.error) waiter.reject(new Error(`inspector: ${message.error.message}`));
      else waiter.resolve(message.result);
    });
    socket.on('close', () => {
      for (const waiter of this.waiting.values()) waiter.reject(new Error('inspector: the connection closed'));
      this.waiting.clear();
    });
  }

  static open(address: string): Promise<Inspector> {
    return new Promise((resolve, reject) => {
      const socket = new WebSocket(address);
      socket.once('open', () => resolve(new Inspector(socket)));
      socket.once('error', reject);
    });
  }

  /** One CDP call; fails when the connection is gone or no answer came within `timeoutMs`. */
  call(method: string, params: Record<string, unknown> = {}, timeoutMs = 60_000): Promise<unknown> {
    if (this.socket.readyState !== WebSocket.OPEN) return Promise.reject(new Error(`inspector: not connected (${method})`));
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => settle(new Error(`inspector: no answer to ${method} within ${timeoutMs} ms`)), timeoutMs);
      const settle = (error: Error | undefined, value?: unknown): void => {
        clearTimeout(timer);
        this.waiting.delete(id);
        if (error) reject(error);
        else resolve(value);
      };
      this.waiting.set(id, { resolve: (value) => settle(undefined, value), reject: settle });
      this.socket.send(JSON.stringify({ id, method, params }), (error) => error && settle(error));
    });
  }

  close(): void {
    this.socket.close();
  }
}
