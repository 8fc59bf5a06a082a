import { SandboxError } from '../errors/index.js';
import type { SandboxSpec } from '../sandbox-spec/index.js';
import type { BackendProbe, Capability } from '../backends/backend.js';

/** The capabilities a backend must have to honour this spec. */
export function requiredCapabilities(spec: SandboxSpec): Capability[] {
  const needed: Capability[] = [
    'limits.cpus', 'limits.memory', 'limits.pids', 'limits.disk', 'limits.fileSize', 'limits.openFiles', 'limits.tmp',
  ];
  if (spec.mounts.length > 0) needed.push('mounts.readOnly');
  if (spec.volumes.length > 0) needed.push('volumes');
  needed.push(`network.${spec.network.mode}`);
  return needed;
}

/** Fails closed: a spec the backend cannot enforce is refused, never silently downgraded. */
export function assertEnforceable(spec: SandboxSpec, probe: BackendProbe): void {
  if (!probe.available) {
    throw new SandboxError('BACKEND_UNAVAILABLE', `backend ${spec.backend} is not available: ${probe.reason ?? 'unknown reason'}`, {
      details: { backend: spec.backend },
      hint: 'Run scripts/setup.sh on the host, or choose another backend.',
    });
  }
  const missing = requiredCapabilities(spec).filter((c) => !probe.capabilities.includes(c));
  if (missing.length > 0) {
    throw new SandboxError('BACKEND_CANNOT_ENFORCE', `backend ${spec.backend} cannot enforce ${missing.join(', ')}`, {
      details: { backend: spec.backend, missing },
      hint: 'Remove the option from the spec or use a backend that supports it; Capsule never downgrades silently.',
    });
  }
}
