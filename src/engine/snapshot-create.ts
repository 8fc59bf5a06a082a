import { SandboxError } from '../errors/index.js';
import type { SandboxSpecInput } from '../sandbox-spec/index.js';
import type { BackendSandbox } from '../backends/backend.js';
import type { SnapshotInfo } from '../wire/index.js';
import type { Interpreters } from './interpreters.js';
import type { LiveSandbox } from './sandbox-table.js';
import type { FullSnapshot } from './snapshots.js';

/**
 * The spec of a sandbox made from a snapshot: the source's environment, working directory, user,
 * backend and TTL policy under what the caller asked; the template is the snapshot's own.
 */
export function fromSnapshotInput(input: SandboxSpecInput, from: SnapshotInfo): SandboxSpecInput {
  if (input.template !== undefined && input.template !== from.template) {
    throw new SandboxError('INVALID_SPEC', `snapshot ${from.snapshotId} is of template ${from.template}, not ${input.template}`, {
      details: { field: 'template', template: input.template, snapshotTemplate: from.template },
      hint: 'Leave spec.template out when creating from a snapshot: the snapshot\'s template is used.',
    });
  }
  if (from.mode === 'full') return fromFullSnapshotInput(input, from);
  const source = from.spec;
  return {
    backend: source.backend,
    env: source.env,
    cwd: source.cwd,
    ...(source.user !== undefined ? { user: source.user } : {}),
    ttlMs: source.ttlMs,
    onTimeout: source.onTimeout,
    autoResume: source.autoResume,
    ...input,
    template: from.template,
  };
}

/** What a create from a full snapshot may choose: the rest is the source's, as its processes knew it. */
const FULL_SNAPSHOT_CHOICES = new Set(['snapshot', 'template', 'ttlMs', 'onTimeout', 'autoResume']);

/**
 * A full snapshot resumes the source's processes: they were started under its backend, limits,
 * environment, mounts and volumes (at the same paths: runsc restores mounts by place), so the new
 * sandbox has the source's spec. Only its TTL policy may differ; anything else is INVALID_SPEC.
 */
function fromFullSnapshotInput(input: SandboxSpecInput, from: SnapshotInfo): SandboxSpecInput {
  const source = from.spec;
  for (const [field, value] of Object.entries(input)) {
    if (value === undefined || FULL_SNAPSHOT_CHOICES.has(field)) continue;
    if (field === 'backend' && value === source.backend) continue;
    throw new SandboxError('INVALID_SPEC', `spec.${field} cannot be set when creating from full snapshot ${from.snapshotId}`, {
      details: { field, snapshotId: from.snapshotId, mode: 'full' },
      hint: 'A full snapshot resumes the source\'s processes under the source\'s spec: pass only snapshot, ttlMs, onTimeout and autoResume, or take a filesystem snapshot to start anew with another spec.',
    });
  }
  const { snapshot: _sourceSnapshot, ...kept } = source;
  return {
    ...kept,
    ...(input.ttlMs !== undefined ? { ttlMs: input.ttlMs } : {}),
    ...(input.onTimeout !== undefined ? { onTimeout: input.onTimeout } : {}),
    ...(input.autoResume !== undefined ? { autoResume: input.autoResume } : {}),
    snapshot: from.snapshotId,
    template: from.template,
  };
}

/**
 * A sandbox restored from a full snapshot: each process that resumed in it is taken over, the
 * drivers of the snapshot's interpreter contexts by contexts of the same ids (their variables
 * intact), the others by its process table (listed, with their stdin, signals and exit).
 */
export function adoptRestored(entry: LiveSandbox & { sandbox: BackendSandbox }, full: FullSnapshot, interpreters: Interpreters): void {
  const contexts = new Map(full.contexts.map((c) => [c.processId, c]));
  for (const process of entry.sandbox.processes?.() ?? []) {
    const context = contexts.get(process.id);
    if (context) interpreters.of(entry.sandbox).adoptContext(context, process);
    else entry.processes.adopt(entry.info, process, entry.quotaBytes);
  }
}
