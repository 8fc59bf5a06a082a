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

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM';
  }
}
