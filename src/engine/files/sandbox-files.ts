import { posix } from 'node:path';
import type { Readable } from 'node:stream';
import { SandboxError } from '../../errors/index.js';
import type { BackendSandbox } from '../../backends/backend.js';
import type { SandboxFiles } from '../types.js';
import type { FileEntry } from '../../wire/index.js';
import { FIND_FORMAT, parseEntries } from './entries.js';
import { fileError, fileErrorFor, type FileErrorContext, type FileOperation } from './errors.js';
import { runHelper, shArgv, type HelperResult } from './helper.js';
import { resolveSandboxPath } from './paths.js';
import { openRead } from './read-stream.js';
import { LIST_SCRIPT, MKDIR_SCRIPT, MOVE_SCRIPT, MOVE_SOURCE_STATUS } from './scripts.js';
import { SandboxWatch } from './watch.js';
import { writeFile, type WriteData } from './write-stream.js';

export interface SandboxFilesOptions {
  /** Limit of one metadata operation (stat, list, mkdir, move, remove). @default 30000 */
  timeoutMs?: number;
  /** A read or write fails after this long without progress; a moving transfer never does. @default 30000 */
  idleTimeoutMs?: number;
  /** Largest listing kept in memory, in bytes of find output (~100 bytes an entry). @default 32 MiB */
  maxListBytes?: number;
  /** Deepest list allowed. @default 32 */
  maxListDepth?: number;
}

const STAT_OUTPUT_BYTES = 64 * 1024;
/** Removing these would empty a mount point and then fail on the mount itself. */
const UNREMOVABLE = new Set(['/', '/workspace', '/tmp']);

/**
 * SandboxFiles over one live sandbox. Every operation is a helper process inside the sandbox
 * (cat, find, mkdir, mv, rm, inotifywait, a small sh script for writes), so paths mean what they
 * mean to the sandbox's own processes: a symlink to /etc/shadow is the sandbox's /etc/shadow,
 * /proc/1/root is the sandbox's root, and no host path is ever opened on its behalf.
 */
export class SandboxFileService implements SandboxFiles {
  private readonly timeoutMs: number;
  private readonly idleTimeoutMs: number;
  private readonly maxListBytes: number;
  private readonly maxListDepth: number;

  constructor(
    private readonly sandbox: BackendSandbox,
    options: SandboxFilesOptions = {},
  ) {
    this.timeoutMs = options.timeoutMs ?? 30_000;
    this.idleTimeoutMs = options.idleTimeoutMs ?? 30_000;
    this.maxListBytes = options.maxListBytes ?? 32 * 1024 * 1024;
    this.maxListDepth = options.maxListDepth ?? 32;
  }

  async read(path: string, options: { signal?: AbortSignal } = {}): Promise<Readable> {
    const resolved = resolveSandboxPath(path);
    return openRead(this.sandbox, resolved, { signal: options.signal, idleTimeoutMs: this.idleTimeoutMs, context: this.context(resolved) });
  }

  /** Writes through a symlink to its target inside the sandbox; the entry returned is the file written. */
  async write(path: string, data: WriteData, options: { signal?: AbortSignal } = {}): Promise<FileEntry> {
    const resolved = resolveSandboxPath(path);
    return writeFile(this.sandbox, resolved, data, { signal: options.signal, idleTimeoutMs: this.idleTimeoutMs, context: this.context(resolved) });
  }

  async list(path: string, depth = 1): Promise<FileEntry[]> {
    const resolved = resolveSandboxPath(path);
    if (!Number.isInteger(depth) || depth < 1 || depth > this.maxListDepth) {
      throw new SandboxError('INVALID_ARGUMENT', `list depth must be a whole number from 1 to ${this.maxListDepth}, not ${depth}`, {
        details: { depth, path: resolved },
        hint: 'Use depth 1 for the directory itself, 2 to include its subdirectories, and so on.',
      });
    }
    const result = await this.helper('list', resolved, shArgv(LIST_SCRIPT, resolved, String(depth), FIND_FORMAT), this.maxListBytes);
    // find exits 1 when an entry below could not be read or vanished mid-walk: it is left out, the rest stand.
    if (!result.ok && result.exitCode !== 1) throw fileError(result, this.context(resolved, 'list'));
    return parseEntries(result.stdout).sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
  }

  /** Describes the path itself: a symlink is reported as a symlink, with its target. */
  async stat(path: string): Promise<FileEntry> {
    const resolved = resolveSandboxPath(path);
    const result = await this.helper('stat', resolved, ['find', resolved, '-maxdepth', '0', '-printf', FIND_FORMAT]);
    return this.single(result, resolved, 'stat');
  }

  /** Creates the directory and any missing parents; ALREADY_EXISTS if the path exists. */
  async mkdir(path: string): Promise<FileEntry> {
    const resolved = resolveSandboxPath(path);
    const result = await this.helper('mkdir', resolved, shArgv(MKDIR_SCRIPT, resolved, posix.dirname(resolved), FIND_FORMAT));
    return this.single(result, resolved, 'mkdir');
  }

  /**
   * rename(2) semantics, as E2B's Move: the destination's parents are created, an existing file
   * (or empty directory) there is replaced, a non-empty directory there is ALREADY_EXISTS.
   */
  async move(source: string, destination: string): Promise<FileEntry> {
    const from = resolveSandboxPath(source, 'source');
    const to = resolveSandboxPath(destination, 'destination');
    if (from === to) return this.stat(from);
    const result = await this.helper('move', to, shArgv(MOVE_SCRIPT, from, to, posix.dirname(to), FIND_FORMAT));
    if (!result.ok && result.exitCode === MOVE_SOURCE_STATUS) throw fileError(result, this.context(from, 'move'));
    return this.single(result, to, 'move');
  }

  /** Removes a file or a whole directory tree. Removing a path that does not exist succeeds (as rm -rf, E2B's Remove). */
  async remove(path: string): Promise<void> {
    const resolved = resolveSandboxPath(path);
    if (UNREMOVABLE.has(resolved)) {
      throw new SandboxError('INVALID_PATH', `remove: ${resolved} is a mount point of the sandbox and cannot be removed`, {
        details: { path: resolved },
        hint: 'Remove the entries inside it instead (list it, then remove each).',
      });
    }
    const result = await this.helper('remove', resolved, ['rm', '-rf', '--', resolved]);
    if (!result.ok) throw fileError(result, this.context(resolved, 'remove'));
  }

  /** See SandboxWatch: `await watch.ready` before making the changes you expect to see. */
  watch(path: string, options: { recursive?: boolean; signal?: AbortSignal } = {}): SandboxWatch {
    const resolved = resolveSandboxPath(path);
    return new SandboxWatch(this.sandbox, resolved, {
      recursive: options.recursive ?? false,
      signal: options.signal,
      setupTimeoutMs: this.timeoutMs,
      context: this.context(resolved),
    });
  }

  private helper(operation: FileOperation, path: string, argv: string[], maxStdoutBytes = STAT_OUTPUT_BYTES): Promise<HelperResult> {
    return runHelper(this.sandbox, argv, { operation, path, timeoutMs: this.timeoutMs, maxStdoutBytes });
  }

  private single(result: HelperResult, path: string, operation: FileOperation): FileEntry {
    if (!result.ok) throw fileError(result, this.context(path, operation));
    const [entry] = parseEntries(result.stdout);
    if (entry === undefined) throw fileErrorFor('INTERNAL', this.context(path, operation), result);
    return entry;
  }

  private context(path: string): Omit<FileErrorContext, 'operation'>;
  private context(path: string, operation: FileOperation): FileErrorContext;
  private context(path: string, operation?: FileOperation): FileErrorContext | Omit<FileErrorContext, 'operation'> {
    const base = { path, sandboxId: this.sandbox.id, limits: this.sandbox.spec.limits };
    return operation === undefined ? base : { ...base, operation };
  }
}
