import { statfs } from 'node:fs/promises';
import { availableParallelism, freemem, loadavg, totalmem } from 'node:os';
import type { Capacity, SandboxInfo } from '../../wire/index.js';

/**
 * The host's capacity beside what the live sandboxes' limits reserve of it: cores, memory and
 * the data directory's filesystem (where workspaces live). Limits are ceilings, not use: the sum
 * may exceed the host (overcommit), which is what an operator wants to see.
 */
export async function hostCapacity(live: readonly SandboxInfo[], dataDir: string | undefined): Promise<Capacity> {
  const reserved = { cpus: 0, memoryBytes: 0, diskBytes: 0 };
  for (const info of live) {
    reserved.cpus += info.spec.limits.cpus;
    reserved.memoryBytes += info.spec.limits.memoryBytes;
    reserved.diskBytes += info.spec.limits.diskBytes;
  }
  let disk: Capacity['disk'] = null;
  if (dataDir !== undefined) {
    const fs = await statfs(dataDir).catch(() => undefined);
    if (fs) disk = { totalBytes: fs.blocks * fs.bsize, freeBytes: fs.bavail * fs.bsize };
  }
  return {
    cpus: availableParallelism(),
    memoryBytes: totalmem(),
    memoryAvailableBytes: freemem(),
    load1: Math.round((loadavg()[0] ?? 0) * 100) / 100,
    sandboxes: {
      live: live.length,
      running: live.filter((i) => i.state === 'running').length,
      paused: live.filter((i) => i.state === 'paused').length,
    },
    reserved: { cpus: Math.round(reserved.cpus * 100) / 100, memoryBytes: reserved.memoryBytes, diskBytes: reserved.diskBytes },
    disk,
  };
}
