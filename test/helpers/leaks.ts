import { readdir, readFile } from 'node:fs/promises';
import { listSandboxCgroups } from '../../src/host/cgroups.host.js';

const SANDBOX_UID_MIN = 3_000_000;
const SANDBOX_UID_MAX = 4_000_000;

export interface Leaks {
  cgroups: string[];
  processes: string[];
  workspaces: string[];
  mounts: string[];
}

/** Everything of ours still on the host: cgroups, sandbox-uid processes, workspaces, mounts. */
export async function findLeaks(volumeMount?: string): Promise<Leaks> {
  const cgroups = await listSandboxCgroups();
  const processes: string[] = [];
  for (const entry of await readdir('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    const status = await readFile(`/proc/${entry}/status`, 'utf8').catch(() => '');
    const uid = Number(/^Uid:\s+(\d+)/m.exec(status)?.[1] ?? -1);
    if (uid >= SANDBOX_UID_MIN && uid < SANDBOX_UID_MAX) {
      const name = /^Name:\s+(.*)$/m.exec(status)?.[1] ?? '?';
      processes.push(`${entry} ${name} uid=${uid}`);
    }
  }
  const workspaces = volumeMount
    ? (await readdir(volumeMount).catch(() => [] as string[])).filter((e) => e.startsWith('ws-'))
    : [];
  const mountinfo = await readFile('/proc/self/mountinfo', 'utf8');
  const mounts = mountinfo
    .split('\n')
    .map((line) => line.split(' ')[4] ?? '')
    .filter((target) => target.includes('capsule') && (!volumeMount || target !== volumeMount));
  return { cgroups, processes, workspaces, mounts };
}

export function describeLeaks(leaks: Leaks): string {
  return Object.entries(leaks)
    .filter(([, list]) => (list as string[]).length > 0)
    .map(([kind, list]) => `${kind}: ${(list as string[]).join(', ')}`)
    .join('; ');
}
