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
import { HostEnvironment } from '../src/host/host-env.host.js';

const CAPSULE_BIN = fileURLToPath(new URL('../../bin/capsule.js', import.meta.url));

export interface BenchServer {
  url: string;
  apiKey: string;
  pid: number;
  dataDir: string;
  /** The server's resident memory now (VmRSS). */
  rssBytes(): Promise<number>;
  /** SIGTERM and wait for the exit (up to `timeoutMs`, then SIGKILL). */
  stop(timeoutMs?: number): Promise<void>;
  /** After stop: the workspace volume unmounted, the data directory removed (kept if anything is still mounted in it). */
  remove(): Promise<void>;
}

/** Starts `capsule serve --port 0` with `flags`; resolves once it printed its URL. */
export async function startBenchServer(flags: readonly string[], options: { stderr?: (line: string) => void } = {}): Promise<BenchServer> {
  const dataDir = await mkdtemp(join(tmpdir(), 'capsule-load-'));
  const apiKey = `cap_${randomBytes(20).toString('hex')}`;
  const child = spawn(process.execPath, [CAPSULE_BIN, 'serve', '--port', '0', '--data-dir', dataDir, '--log-level', 'warn', ...flags], {
    env: { ...process.env, CAPSULE_API_KEY: apiKey },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  child.stderr?.setEncoding('utf8');
  child.stderr?.on('data', (chunk: string) => options.stderr?.(chunk));
  try {
    const url = await urlOf(child);
    return {
      url,
      apiKey,
      pid: child.pid!,
      dataDir,
      rssBytes: async () => Number(/^VmRSS:\s+(\d+) kB/m.exec(await readFile(`/proc/${child.pid}/status`, 'utf8'))?.[1] ?? 0) * 1024,
      stop: (timeoutMs = 120_000) => stopChild(child, timeoutMs),
      remove: () => removeDataDir(dataDir),
    };
  } catch (error) {
    await stopChild(child, 10_000);
    await removeDataDir(dataDir);
    throw error;
  }
}

function urlOf(child: ChildProcess): Promise<string> {
  return new Promise((resolve, reject) => {
    let seen = '';
    const timer = setTimeout(() => reject(new Error(`capsule serve printed no URL within 120 s: ${seen}`)), 120_000);
    child.stdout?.setEncoding('utf8');
    child.stdout?.on('data', (chunk: string) => {
      seen += chunk;
      const match = /^URL: (\S+)$/m.exec(seen);
      if (match) {
        clearTimeout(timer);
        resolve(match[1]!);
      }
    });
    child.once('exit', (code, signal) => {
      clearTimeout(timer);
      reject(new Error(`capsule serve exited (${code ?? signal}) before it listened: ${seen}`));
    });
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
