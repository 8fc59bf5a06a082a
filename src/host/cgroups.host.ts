import { readFile, rmdir, mkdir, writeFile, readdir } from 'node:fs/promises';
import { join } from 'node:path';
import { watch } from 'node:fs';
import { SandboxError } from '../errors/index.js';
import { pathExists } from './fs-util.js';

/** cgroup v1 hierarchies that hold limits; the v2 group is used for atomic kill and freeze. */
export const V1_CONTROLLERS = ['memory', 'pids', 'cpu'] as const;
const CGROUP_ROOT = '/sys/fs/cgroup';
export const CGROUP_PREFIX = 'capsule-';

export interface CgroupLimits {
  memoryBytes: number;
  pids: number;
  cpus: number;
}

/** Counters read from the kernel; they tell a limit kill apart from the program's own failure. */
export interface CgroupCounters {
  oomKills: number;
  pidsMaxEvents: number;
  memoryPeakBytes: number;
  memoryUsageBytes: number;
  cpuUsageUsec: number;
  cpuThrottledUsec: number;
}

/**
 * One sandbox's cgroups: v1 memory (+memsw) / pids / cpu for limits, v2 for kill and freeze.
 * Every method is a handful of small file writes; nothing spawns.
 */
export class SandboxCgroup {
  readonly name: string;

  private constructor(name: string) {
    this.name = name;
  }

  /** `prefix` names the Capsule instance (see HostEnvironment.cgroupPrefix); `id` the sandbox. */
  static async create(prefix: string, id: string, limits: CgroupLimits): Promise<SandboxCgroup> {
    const cgroup = new SandboxCgroup(`${prefix}${id}`);
    try {
      for (const dir of cgroup.dirs()) await mkdir(dir);
      await writeFile(join(cgroup.dir('memory'), 'memory.swappiness'), '0');
      await cgroup.setLimits(limits);
    } catch (error) {
      await cgroup.remove().catch(() => undefined);
      throw new SandboxError('HOST_NOT_READY', `cannot set up cgroups for ${id}: ${(error as Error).message}`, {
        cause: error,
        hint: 'Capsule needs root and cgroup v1 memory, pids and cpu hierarchies plus the cgroup2 mount at /sys/fs/cgroup/unified.',
      });
    }
    return cgroup;
  }

  static attach(name: string): SandboxCgroup {
    return new SandboxCgroup(name);
  }

  dir(controller: (typeof V1_CONTROLLERS)[number] | 'unified'): string {
    return join(CGROUP_ROOT, controller, this.name);
  }

  dirs(): string[] {
    return [...V1_CONTROLLERS.map((c) => this.dir(c)), this.dir('unified')];
  }

  /** Files a launcher writes its pid to, so that everything it starts is limited. */
  procsFiles(): string[] {
    return this.dirs().map((d) => join(d, 'cgroup.procs'));
  }

  async counters(): Promise<CgroupCounters> {
    const mem = this.dir('memory');
    const [oom, pidsEvents, peak, usage, cpuStat] = await Promise.all([
      readFile(join(mem, 'memory.oom_control'), 'utf8'),
      readFile(join(this.dir('pids'), 'pids.events'), 'utf8'),
      readFile(join(mem, 'memory.max_usage_in_bytes'), 'utf8'),
      readFile(join(mem, 'memory.usage_in_bytes'), 'utf8'),
      readFile(join(this.dir('unified'), 'cpu.stat'), 'utf8').catch(() => ''),
    ]);
    const throttled = await readFile(join(this.dir('cpu'), 'cpu.stat'), 'utf8').catch(() => '');
    return {
      oomKills: keyed(oom, 'oom_kill'),
      pidsMaxEvents: keyed(pidsEvents, 'max'),
      memoryPeakBytes: Number(peak.trim()),
      memoryUsageBytes: Number(usage.trim()),
      cpuUsageUsec: keyed(cpuStat, 'usage_usec'),
      cpuThrottledUsec: Math.round(keyed(throttled, 'throttled_time') / 1000),
    };
  }

  /** Sets memory (+memsw), pids and cpu; works on a live group (a pooled sandbox's new spec). */
  async setLimits(limits: CgroupLimits): Promise<void> {
    const mem = this.dir('memory');
    const current = Number((await readFile(join(mem, 'memory.limit_in_bytes'), 'utf8')).trim());
    // memsw may never be below the memory limit: raise memsw first, lower it last.
    const order = limits.memoryBytes >= current ? ['memory.memsw.limit_in_bytes', 'memory.limit_in_bytes'] : ['memory.limit_in_bytes', 'memory.memsw.limit_in_bytes'];
    for (const file of order) await writeFileIfExists(join(mem, file), String(limits.memoryBytes));
    await writeFile(join(this.dir('pids'), 'pids.max'), String(limits.pids));
    const period = 100_000;
    await writeFile(join(this.dir('cpu'), 'cpu.cfs_period_us'), String(period));
    await writeFile(join(this.dir('cpu'), 'cpu.cfs_quota_us'), String(Math.max(1000, Math.round(limits.cpus * period))));
  }

  async memoryUsageBytes(): Promise<number> {
    return Number((await readFile(join(this.dir('memory'), 'memory.usage_in_bytes'), 'utf8')).trim());
  }

  async resetPeak(): Promise<void> {
    await writeFile(join(this.dir('memory'), 'memory.max_usage_in_bytes'), '0').catch(() => undefined);
  }

  /** Freezes or thaws every process at once; returns when the kernel reports it done. */
  async freeze(frozen: boolean, timeoutMs = 5000): Promise<void> {
    await writeFile(join(this.dir('unified'), 'cgroup.freeze'), frozen ? '1' : '0');
    await waitForEvent(join(this.dir('unified'), 'cgroup.events'), 'frozen', frozen ? 1 : 0, timeoutMs);
  }

  async isPopulated(): Promise<boolean> {
    const events = await readFile(join(this.dir('unified'), 'cgroup.events'), 'utf8').catch(() => 'populated 0');
    return keyed(events, 'populated') === 1;
  }

  /** Kills every process in the sandbox at once and waits until the group is empty. */
  async kill(timeoutMs = 5000): Promise<void> {
    const unified = this.dir('unified');
    if (!(await pathExists(unified))) return;
    // A frozen group must thaw for the SIGKILL to be acted on.
    await writeFile(join(unified, 'cgroup.freeze'), '0').catch(() => undefined);
    await writeFile(join(unified, 'cgroup.kill'), '1').catch(() => undefined);
    await waitUntilEmpty(join(unified, 'cgroup.events'), timeoutMs);
  }

  /** Kills what is left and removes every directory. Safe to call twice. */
  async remove(): Promise<void> {
    await this.kill();
    const failures: string[] = [];
    for (const dir of this.dirs()) {
      try {
        await rmdir(dir);
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code !== 'ENOENT') failures.push(`${dir}: ${(error as Error).message}`);
      }
    }
    if (failures.length > 0) {
      throw new SandboxError('INTERNAL', `cgroup cleanup failed: ${failures.join('; ')}`);
    }
  }
}

/** Names of cgroups with this prefix present on the host, for reconciliation after a crash. */
export async function listSandboxCgroups(prefix: string = CGROUP_PREFIX): Promise<string[]> {
  const names = new Set<string>();
  for (const controller of [...V1_CONTROLLERS, 'unified']) {
    const entries = await readdir(join(CGROUP_ROOT, controller)).catch(() => [] as string[]);
    for (const entry of entries) if (entry.startsWith(prefix)) names.add(entry);
  }
  return [...names];
}

function keyed(text: string, key: string): number {
  for (const line of text.split('\n')) {
    const [k, v] = line.split(' ');
    if (k === key && v !== undefined) return Number(v);
  }
  return 0;
}


async function writeFileIfExists(path: string, value: string): Promise<void> {
  try {
    await writeFile(path, value);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== 'ENOENT') throw error;
  }
}

async function waitUntilEmpty(eventsFile: string, timeoutMs: number): Promise<void> {
  await waitForEvent(eventsFile, 'populated', 0, timeoutMs);
}

/**
 * Waits until `key` in cgroup.events has `value`; the kernel signals changes of that file to
 * inotify. A group that is gone counts as empty and thawed.
 */
async function waitForEvent(eventsFile: string, key: string, value: number, timeoutMs: number): Promise<void> {
  const populated = async (): Promise<boolean> => {
    const text = await readFile(eventsFile, 'utf8').catch(() => 'populated 0\nfrozen 0');
    return keyed(text, key) !== value;
  };
  if (!(await populated())) return;
  await new Promise<void>((resolve, reject) => {
    let settled = false;
    const watcher = watch(eventsFile, () => void check());
    const timer = setTimeout(() => finish(new SandboxError('INTERNAL', `cgroup did not reach ${key} ${value} within ${timeoutMs} ms: ${eventsFile}`)), timeoutMs);
    function finish(error?: Error): void {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      watcher.close();
      if (error) reject(error);
      else resolve();
    }
    async function check(): Promise<void> {
      if (!(await populated())) finish();
    }
    void check();
  });
}
