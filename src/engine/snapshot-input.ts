import { SandboxError } from '../errors/index.js';
import type { SandboxSpecInput } from '../sandbox-spec/index.js';
import type { SnapshotInfo } from '../wire/index.js';

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
  const source = from.spec;
  return {
    backend: source.backend,
    env: source.env,
    cwd: source.cwd,
    ...(source.user !== undefined ? { user: source.user } : {}),
    ttlMs: source.ttlMs,
    onTimeout: source.onTimeout,
    ...input,
    template: from.template,
  };
}
