import { access } from 'node:fs/promises';

/** True when `path` exists (any type; a dangling symlink counts as missing). */
export async function pathExists(path: string): Promise<boolean> {
  try {
    await access(path);
    return true;
  } catch {
    return false;
  }
}
