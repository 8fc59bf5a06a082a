import { readFile } from 'node:fs/promises';

/** What the host has for sandboxes, as the kernel reports it. */
export interface HostLimits {
  /** MemTotal of /proc/meminfo. */
  memoryBytes: number;
  /** Task ids the kernel can hand out: the lesser of kernel.pid_max and kernel.threads-max. */
  pids: number;
}

/** Reads the host's memory and task-id limits once (they change only when the operator tunes the kernel). */
export async function readHostLimits(): Promise<HostLimits> {
  const [meminfo, pidMax, threadsMax] = await Promise.all([
    readFile('/proc/meminfo', 'utf8'),
    readFile('/proc/sys/kernel/pid_max', 'utf8'),
    readFile('/proc/sys/kernel/threads-max', 'utf8'),
  ]);
  const kib = /^MemTotal:\s+(\d+) kB/m.exec(meminfo)?.[1];
  if (kib === undefined) throw new Error('/proc/meminfo has no MemTotal line');
  return { memoryBytes: Number(kib) * 1024, pids: Math.min(Number(pidMax.trim()), Number(threadsMax.trim())) };
}
