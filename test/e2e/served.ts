import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { join, resolve } from 'node:path';
import { expect } from 'vitest';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { describeLeaks, findLeaks } from '../helpers/leaks.js';
import { expectNoLeaks } from '../helpers/sandbox.js';

/**
 * `capsule serve` (the built CLI, dist/) as a child process on a data directory of the test's
 * own, for tests that SIGKILL or stop it and start it again.
 */
const ROOT = resolve(import.meta.dirname, '../..');
const BIN = join(ROOT, 'bin/capsule.js');
export const isBuilt = existsSync(join(ROOT, 'dist/src/server/bootstrap.js'));

export interface Served {
  child: ChildProcessWithoutNullStreams;
  url: string;
  stderr: () => string;
}

export class ServedInstance {
  readonly children: ChildProcessWithoutNullStreams[] = [];

  constructor(
    readonly dataDir: string,
    readonly apiKey: string,
  ) {}

  /** Starts `capsule serve` with `extra` flags; resolves once it printed its URL and key lines. */
  async serve(...extra: string[]): Promise<Served> {
    const args = [BIN, 'serve', '--port', '0', '--data-dir', this.dataDir, '--log-level', 'warn', '--warm-pool', '0', ...extra];
    const child = spawn(process.execPath, args, { env: { ...process.env, CAPSULE_API_KEY: this.apiKey } });
    this.children.push(child);
    let stdout = '';
    let stderr = '';
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    const url = await new Promise<string>((resolveUrl, reject) => {
      const timer = setTimeout(() => reject(new Error(`capsule serve did not start in 60 s: ${stderr}`)), 60_000);
      child.stdout.on('data', (d: Buffer) => {
        stdout += d.toString();
        const match = /^URL: (\S+)$/m.exec(stdout);
        if (match?.[1] && /^API key: /m.test(stdout)) {
          clearTimeout(timer);
          resolveUrl(match[1]);
        }
      });
      child.once('exit', (code) => reject(new Error(`capsule serve exited with ${code}: ${stderr}`)));
    });
    return { child, url, stderr: () => stderr };
  }

  /** A JSON call with the instance's key. */
  api(url: string) {
    return async <T = Record<string, unknown>>(method: string, path: string, body?: unknown, headers: Record<string, string> = {}) => {
      const response = await fetch(`${url}${path}`, {
        method,
        headers: { authorization: `Bearer ${this.apiKey}`, ...(body === undefined ? {} : { 'content-type': 'application/json' }), ...headers },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
      const text = await response.text();
      return { status: response.status, body: (text === '' ? null : JSON.parse(text)) as T };
    };
  }

  /** SIGTERM to every server still running, and the wait for it. */
  async stopAll(): Promise<void> {
    for (const child of this.children) {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill('SIGTERM');
        await exited(child);
      }
    }
  }

  /**
   * Ends what a failed test left running: a stop leaves supervised sandboxes running by
   * default, so one more start with --stop-sandboxes and its stop end them.
   */
  async cleanUp(): Promise<void> {
    await this.stopAll();
    const run = join(this.dataDir, 'run');
    if (!existsSync(run) || readdirSync(run).length === 0) return;
    const last = await this.serve('--stop-sandboxes');
    last.child.kill('SIGTERM');
    await exited(last.child);
  }

  /**
   * After the file: ends what is left running, removes the instance's volume and data directory,
   * and fails on any host resource of the instance left behind.
   */
  async tearDown(): Promise<void> {
    await this.cleanUp();
    const leaks = describeLeaks(await findLeaks(this.dataDir));
    await new HostEnvironment({ dataDir: this.dataDir }).volume.unmount().catch(() => undefined);
    rmSync(this.dataDir, { recursive: true, force: true });
    expect(leaks, 'host resources of the instance left behind').toBe('');
    await expectNoLeaks();
  }

  supervisorPid(sandboxId: string): number {
    return Number(readFileSync(join(this.dataDir, 'run', `${sandboxId}.pid`), 'utf8').trim());
  }
}

export function exited(child: ChildProcessWithoutNullStreams): Promise<void> {
  return child.exitCode !== null || child.signalCode !== null ? Promise.resolve() : new Promise((r) => child.once('exit', () => r()));
}

export function alive(pid: number): boolean {
  let stat = '';
  try {
    stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  } catch {
    return false;
  }
  return !/^\d+ \(.*\) Z /s.test(stat);
}

/** A loopback TCP port free now (for a server that must come back on the same port). */
export function freePort(): Promise<number> {
  return new Promise((resolvePort, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      const port = typeof address === 'object' && address ? address.port : 0;
      server.close(() => resolvePort(port));
    });
  });
}
