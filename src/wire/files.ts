import { z } from 'zod';
import { queryNumber, SandboxPath } from './common.js';

export const FILE_TYPES = ['file', 'dir', 'symlink', 'other'] as const;

export const FileEntrySchema = z.object({
  name: z.string(),
  /** Absolute path as the sandbox sees it. */
  path: z.string(),
  type: z.enum(FILE_TYPES),
  size: z.number(),
  /** Permission bits, e.g. 0o644. */
  mode: z.number(),
  modifiedAt: z.string(),
  symlinkTarget: z.string().optional(),
});

export const WATCH_EVENT_TYPES = ['create', 'write', 'remove', 'rename', 'chmod'] as const;
export const WatchEventSchema = z.object({ type: z.enum(WATCH_EVENT_TYPES), path: z.string() });

export const PathQuery = z.strictObject({ path: SandboxPath });
export const ListFilesQuery = z.strictObject({ path: SandboxPath, depth: queryNumber(2, 1, 32).optional() });
export const WatchQuery = z.strictObject({ path: SandboxPath, recursive: z.enum(['true', 'false']).transform((v) => v === 'true').optional() });
export const MkdirBody = z.strictObject({ path: SandboxPath });
export const MoveBody = z.strictObject({ source: SandboxPath, destination: SandboxPath });

export type FileType = (typeof FILE_TYPES)[number];
export type FileEntry = z.output<typeof FileEntrySchema>;
export type WatchEvent = z.output<typeof WatchEventSchema>;
