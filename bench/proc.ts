import { readdir, readFile } from 'node:fs/promises';

/** Live descendants of `root`, itself excluded (a server's or a bench's sandbox processes). */
export async function descendants(root: number): Promise<number[]> {
  const parents = new Map<number, number>();
  for (const entry of await readdir('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    const stat = await readFile(`/proc/${entry}/stat`, 'utf8').catch(() => '');
    const match = /^\d+ \(.*\) \S+ (\d+)/s.exec(stat);
    if (match) parents.set(Number(entry), Number(match[1]));
  }
  const found: number[] = [];
  for (const pid of parents.keys()) {
    let cursor = parents.get(pid);
    for (let hops = 0; cursor !== undefined && cursor > 1 && hops < 64; hops++) {
      if (cursor === root) {
        found.push(pid);
        break;
      }
      cursor = parents.get(cursor);
    }
  }
  return found;
}

/** A process's proportional set size (its share of pages it shares), in bytes; 0 when it is gone. */
export async function pssBytes(pid: number): Promise<number> {
  const rollup = await readFile(`/proc/${pid}/smaps_rollup`, 'utf8').catch(() => '');
  return Number(/^Pss:\s+(\d+) kB/m.exec(rollup)?.[1] ?? 0) * 1024;
}
