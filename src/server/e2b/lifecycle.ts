import { z } from 'zod';
import type { SandboxSpecInput } from '../../sandbox-spec/index.js';
import { SNAPSHOT_ID_PATTERN } from '../../wire/index.js';
import { unsupported } from './answers.js';
import type { E2bContext } from './deps.js';
import { e2bNetworkPolicy } from './network.js';

/** The parts of E2B's create body that decide what a sandbox stands on and how it ends. */
export const StateFields = {
  autoPause: z.boolean().optional(),
  autoPauseMemory: z.boolean().optional(),
  autoResume: z.object({ enabled: z.boolean() }).loose().optional(),
  volumeMounts: z.array(z.object({ name: z.string(), path: z.string() }).loose()).optional(),
};

export interface StateBody {
  templateID: string;
  envVars?: Record<string, string> | undefined;
  autoPause?: boolean | undefined;
  autoPauseMemory?: boolean | undefined;
  autoResume?: { enabled: boolean } | undefined;
  volumeMounts?: { name: string; path: string }[] | undefined;
  network?: unknown;
}

/** Whether E2B's `templateID` names one of the caller's snapshots (`Sandbox.create(snapshotId)`). */
export function isSnapshotId(templateID: string): boolean {
  return SNAPSHOT_ID_PATTERN.test(templateID);
}

/**
 * E2B's lifecycle, volumes and snapshot source onto a spec made for the template:
 * - `lifecycle.onTimeout: 'pause'` (`autoPause`) is `onTimeout: 'pause'` (memory kept, TTL
 *   suspended while paused); `keepMemory: false` there is refused by name.
 * - `lifecycle.autoResume` is `autoResume`: the next envd call (or a connect) resumes it.
 * - `volumeMounts` (`{path: name}`) are `volumes`, read-write, by the tenant's volume names.
 * - a snapshot id as the template is `snapshot`: its files, env, working directory, user and
 *   backend, with the caller's `envs` on top.
 */
export function withState(spec: SandboxSpecInput, body: StateBody, ctx: E2bContext, tenantId: string): SandboxSpecInput {
  const out: SandboxSpecInput = { ...spec };
  if (body.autoPauseMemory === false) {
    throw unsupported(
      'lifecycle.onTimeout.keepMemory: false',
      'a sandbox pausing at its timeout keeps its processes and memory',
      'Leave keepMemory out (true), or call sandbox.pause({ keepMemory: false }) yourself before the timeout.',
    );
  }
  if (body.autoPause === true) out.onTimeout = 'pause';
  if (body.autoResume?.enabled === true) out.autoResume = true;
  const network = out.network === undefined ? e2bNetworkPolicy(body.network) : undefined;
  if (network !== undefined) out.network = network;
  if (body.volumeMounts?.length) out.volumes = body.volumeMounts.map((mount) => ({ name: mount.name, path: mount.path }));
  if (isSnapshotId(body.templateID)) {
    const snapshot = ctx.engine.getSnapshot(tenantId, body.templateID);
    delete out.template;
    delete out.cwd;
    out.snapshot = snapshot.snapshotId;
    out.env = { ...snapshot.spec.env, ...(body.envVars ?? {}) };
  }
  return out;
}
