import { SandboxError } from '../../errors/index.js';
import type { FileEntry, FileType } from '../../wire/index.js';
import { baseName } from './paths.js';

/**
 * find(1) -printf format of one entry: type, size, mode, mtime, link target, path, each ended by
 * NUL, so any name (newlines included) parses unambiguously.
 */
export const FIND_FORMAT = '%y\\0%s\\0%m\\0%T@\\0%l\\0%p\\0';
const FIELDS = 6;

const TYPES: Record<string, FileType> = { f: 'file', d: 'dir', l: 'symlink' };

/**
 * Parses what FIND_FORMAT printed. The bytes come from inside the sandbox, where a hostile
 * process could forge them; anything malformed is an error, never a crash or a guess.
 */
export function parseEntries(output: Buffer): FileEntry[] {
  const fields = output.toString('utf8').split('\0');
  if (fields.pop() !== '' || fields.length % FIELDS !== 0) throw malformed(output);
  const entries: FileEntry[] = [];
  for (let i = 0; i < fields.length; i += FIELDS) {
    const [type, size, mode, mtime, target, path] = fields.slice(i, i + FIELDS) as [string, string, string, string, string, string];
    const sizeBytes = Number(size);
    const modeBits = Number.parseInt(mode, 8);
    const modifiedAt = new Date(Math.floor(Number(mtime) * 1000));
    if (!/^-?\d+(\.\d+)?$/.test(mtime) || Number.isNaN(modifiedAt.getTime()) || !/^\d+$/.test(size) || !/^[0-7]{1,6}$/.test(mode) || !path.startsWith('/')) throw malformed(output);
    const entry: FileEntry = {
      name: baseName(path),
      path,
      type: TYPES[type] ?? 'other',
      size: sizeBytes,
      mode: modeBits & 0o7777,
      modifiedAt: modifiedAt.toISOString(),
    };
    if (entry.type === 'symlink') entry.symlinkTarget = target;
    entries.push(entry);
  }
  return entries;
}

function malformed(output: Buffer): SandboxError {
  return new SandboxError('INTERNAL', 'the sandbox returned a file listing that cannot be read', {
    details: { bytes: output.length, head: output.subarray(0, 200).toString('utf8') },
    hint: 'Retry; a process in the sandbox may be interfering with the file helpers.',
  });
}
