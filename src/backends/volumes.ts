import { SandboxError } from '../errors/index.js';
import type { SandboxSpec } from '../sandbox-spec/index.js';

/** The host directories of `spec.volumes`, or INTERNAL when the engine did not resolve each one (fail closed). */
export function volumesOf(spec: SandboxSpec, volumes: readonly string[] | undefined): readonly string[] {
  const resolved = volumes ?? [];
  if (resolved.length !== spec.volumes.length) {
    throw new SandboxError('INTERNAL', 'the spec has volumes that were not resolved for its tenant', {
      hint: 'Create sandboxes through the engine (SandboxManager), which resolves volumes by tenant.',
    });
  }
  return resolved;
}
