import { constants } from 'node:fs';
import { copyFile, lstat, mkdir, readdir } from 'node:fs/promises';
import { join, relative } from 'node:path';

export interface CopiedFile {
  path: string;
  size: number;
}

export interface CopyOutReport {
  files: CopiedFile[];
  /** Entries not copied: symlinks, devices, sockets. A symlink could point at a host file. */
  skipped: { path: string; reason: 'symlink' | 'special' }[];
}

/**
 * Copies regular files and directories from a (frozen) sandbox directory to a host directory.
 * Symlinks are never followed nor copied: a link the sandbox made may name any host path.
 */
export async function copyOut(sourceDir: string, targetDir: string): Promise<CopyOutReport> {
  const report: CopyOutReport = { files: [], skipped: [] };
  const root = await lstat(sourceDir).catch(() => undefined);
  if (!root?.isDirectory()) return report;
  await mkdir(targetDir, { recursive: true });
  await walk(sourceDir, sourceDir, targetDir, report);
  return report;
}

async function walk(root: string, dir: string, targetRoot: string, report: CopyOutReport): Promise<void> {
  for (const name of await readdir(dir)) {
    const source = join(dir, name);
    const rel = relative(root, source);
    const target = join(targetRoot, rel);
    const info = await lstat(source);
    if (info.isSymbolicLink()) report.skipped.push({ path: rel, reason: 'symlink' });
    else if (info.isDirectory()) {
      await mkdir(target, { recursive: true });
      await walk(root, source, targetRoot, report);
    } else if (info.isFile()) {
      await copyFile(source, target, constants.COPYFILE_FICLONE);
      report.files.push({ path: rel, size: info.size });
    } else report.skipped.push({ path: rel, reason: 'special' });
  }
}
