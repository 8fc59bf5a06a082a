import { closeSync, mkdirSync, openSync, readFileSync, unlinkSync, writeSync } from 'node:fs';
import { mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { SandboxError } from '../errors/index.js';

const RETRY_MS = 20;

/**
 * Runs `fn` while holding a lock directory, so that two Capsule processes on one data dir (a
 * server and a CLI run) do not format or mount the same volume at once. A lock whose owner died
 * is taken over. Waits up to `timeoutMs`.
 */
export async function withLock<T>(lockDir: string, fn: () => Promise<T>, timeoutMs = 30_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      await mkdir(lockDir);
      break;
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw error;
      const owner = Number(await readFile(join(lockDir, 'pid'), 'utf8').catch(() => '0'));
      if (owner > 0 && !isAlive(owner)) {
        await rm(lockDir, { recursive: true, force: true });
        continue;
      }
      if (Date.now() > deadline) {
        throw new SandboxError('HOST_NOT_READY', `timed out waiting for the lock ${lockDir} (held by pid ${owner || 'unknown'})`, {
          hint: 'Another Capsule process is preparing this data dir; if none runs, remove the lock directory.',
        });
      }
      await new Promise((resolve) => setTimeout(resolve, RETRY_MS));
    }
  }
  try {
    await writeFile(join(lockDir, 'pid'), String(process.pid));
    return await fn();
  } finally {
    await rm(lockDir, { recursive: true, force: true });
  }
}

export const LOCK_FILE = 'server.lock';

/**
 * One server per data directory: a second one would reconcile away the first one's sandboxes at
 * start-up. The lock is a file holding the owner's pid; a lock whose pid is gone (a crash) is
 * taken over.
 */
export class InstanceLock {
  private constructor(private readonly path: string) {}

  static acquire(dataDir: string): InstanceLock {
    mkdirSync(dataDir, { recursive: true, mode: 0o700 });
    const path = join(dataDir, LOCK_FILE);
    for (let attempt = 0; attempt < 3; attempt++) {
      try {
        const fd = openSync(path, 'wx', 0o600);
        writeSync(fd, `${process.pid}\n`);
        closeSync(fd);
        return new InstanceLock(path);
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw error;
      }
      const owner = Number(readFileSync(path, 'utf8').trim());
      if (Number.isInteger(owner) && owner > 0 && isAlive(owner)) {
        throw new SandboxError('HOST_NOT_READY', `another Capsule server (pid ${owner}) uses the data directory ${dataDir}`, {
          details: { dataDir, pid: owner },
          hint: 'Stop it first, or give this server its own --data-dir.',
        });
      }
      unlinkSync(path); // left by a server that died; retry the exclusive create
    }
    throw new SandboxError('HOST_NOT_READY', `could not take the server lock in ${dataDir}`, { details: { dataDir } });
  }

  release(): void {
    try {
      unlinkSync(this.path);
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== 'ENOENT') throw error;
    }
  }
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM';
  }
}
