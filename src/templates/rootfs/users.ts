import { readFileInRoot } from './in-root.js';

/** Ids a template may use: its sandbox's user namespace maps exactly 65,536 (R1 §1.2). */
export const MAX_TEMPLATE_ID = 65_535;

export interface ResolvedUser {
  uid: number;
  gid: number;
}

interface Entry {
  name: string;
  id: number;
  /** passwd: the primary group. */
  gid?: number;
}

export function parsePasswd(text: string): Entry[] {
  return parseColonFile(text, (fields) => ({ name: fields[0]!, id: Number(fields[2]), gid: Number(fields[3]) }));
}

export function parseGroup(text: string): Entry[] {
  return parseColonFile(text, (fields) => ({ name: fields[0]!, id: Number(fields[2]) }));
}

function parseColonFile(text: string, entry: (fields: string[]) => Entry): Entry[] {
  return text
    .split('\n')
    .filter((line) => line !== '' && !line.startsWith('#'))
    .map((line) => entry(line.split(':')))
    .filter((e) => e.name !== '' && Number.isInteger(e.id) && e.id >= 0);
}

/**
 * Resolves a user spec (`name`, `uid`, `name:group`, `uid:gid`, …) against the passwd and group
 * text of a template, as Docker does: a name must exist; a bare uid takes its passwd entry's
 * group, or 0; ids past 65535 cannot be mapped into a sandbox. Returns the ids or the problem.
 */
export function resolveUserSpec(spec: string, passwd: string, group: string): ResolvedUser | string {
  const [userPart = '', groupPart] = spec.split(':', 2);
  if (userPart === '') return `"${spec}" names no user`;
  const users = parsePasswd(passwd);
  const numeric = /^\d+$/.test(userPart);
  const entry = numeric ? users.find((u) => u.id === Number(userPart)) : users.find((u) => u.name === userPart);
  if (!numeric && !entry) return `user "${userPart}" is not in the template's /etc/passwd`;
  const uid = numeric ? Number(userPart) : entry!.id;
  let gid = entry?.gid ?? 0;
  if (groupPart !== undefined && groupPart !== '') {
    if (/^\d+$/.test(groupPart)) gid = Number(groupPart);
    else {
      const found = parseGroup(group).find((g) => g.name === groupPart);
      if (!found) return `group "${groupPart}" is not in the template's /etc/group`;
      gid = found.id;
    }
  }
  if (uid > MAX_TEMPLATE_ID || gid > MAX_TEMPLATE_ID) {
    return `"${spec}" is ${uid}:${gid}; a template's ids must be at most ${MAX_TEMPLATE_ID} (a sandbox maps 65,536 ids)`;
  }
  return { uid, gid };
}

/** resolveUserSpec against the files inside a template root. */
export async function resolveUserInRoot(root: string, spec: string): Promise<ResolvedUser | string> {
  const passwd = (await readFileInRoot(root, '/etc/passwd')) ?? '';
  const group = (await readFileInRoot(root, '/etc/group')) ?? '';
  return resolveUserSpec(spec, passwd, group);
}
