import { readFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';

/**
 * Names of things a Capsule process leaves on disk while it works (a layer being filled, a build's
 * temp dir, a lease) start with its owner: pid and the process's start time in clock ticks, so a
 * reused pid is never mistaken for the owner. Reconciliation removes what a dead owner left, and
 * never what a live process (a server while a CLI runs, or the reverse) is still working on.
 */
export function ownerTag(pid: number = process.pid): string | undefined {
  const start = processStartTime(pid);
  return start === undefined ? undefined : `${pid}.${start}`;
}

/** A fresh name owned by this process: `<pid>.<start>.<random>`. */
export function ownedName(): string {
  const tag = ownerTag();
  if (tag === undefined) throw new Error('cannot read /proc/self/stat');
  return `${tag}.${randomBytes(6).toString('hex')}`;
}

/** True when the process that made `name` (see ownedName) still runs; malformed names are dead. */
export function isOwnerAlive(name: string): boolean {
  const match = /^(\d+)\.(\d+)\./.exec(name);
  if (!match) return false;
  return processStartTime(Number(match[1])) === match[2];
}

/** Field 22 of /proc/PID/stat (after the parenthesised name, which may hold spaces). */
function processStartTime(pid: number): string | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return fields[19];
  } catch {
    return undefined;
  }
}
