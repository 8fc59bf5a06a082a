import { LimitsSchema, NetworkPolicySchema, SandboxSpecSchema, type Limits, type SandboxSpec } from './schema.js';

/** What a spec opens beyond the least capable sandbox; absent keys are at their defaults. */
export interface Loosenings {
  /** Limits raised above their defaults, with the value asked for. */
  limits?: Partial<Limits>;
  /** A time to live longer than the default. */
  ttlMs?: number;
  /** Any network at all, with what it may reach. */
  network?: { mode: SandboxSpec['network']['mode']; allow: string[]; maxConnections?: number; maxConcurrentConnections?: number };
  /** Credential-broker handles the sandbox may spend. */
  handles?: string[];
  /** Processes run as root (in the sandbox's own user namespace) unless a call names another user. */
  user?: 'root';
  /** Ports anyone may reach through the server's port URLs, without a token. */
  publicPorts?: number[];
  /** Host mounts, by granted root (never a host path). */
  mounts?: { root: string; subpath: string; sandboxPath: string; readOnly: boolean }[];
}

const DEFAULT_LIMITS = LimitsSchema.parse({});
const DEFAULT_NETWORK = NetworkPolicySchema.parse({});
const DEFAULT_TTL_MS = SandboxSpecSchema.parse({}).ttlMs;

/**
 * Every way `spec` is looser than the defaults: raised limits, a longer TTL, a network (mode,
 * allow entries, raised connection budgets), handles, root as the default user and mounts. This is what the audit log
 * records as the `policy` of a create, so an auditor sees each capability a tenant opened.
 * Undefined when the spec opens nothing. Pure.
 */
export function loosenings(spec: SandboxSpec): Loosenings | undefined {
  const found: Loosenings = {};
  const raised: Partial<Record<keyof Limits, number>> = {};
  for (const key of Object.keys(DEFAULT_LIMITS) as (keyof Limits)[]) {
    if (spec.limits[key] > DEFAULT_LIMITS[key]) raised[key] = spec.limits[key];
  }
  if (Object.keys(raised).length > 0) found.limits = raised;
  if (spec.ttlMs > DEFAULT_TTL_MS) found.ttlMs = spec.ttlMs;
  const { network } = spec;
  if (network.mode !== 'none') {
    found.network = {
      mode: network.mode,
      allow: [...network.allow],
      ...(network.maxConnections > DEFAULT_NETWORK.maxConnections ? { maxConnections: network.maxConnections } : {}),
      ...(network.maxConcurrentConnections > DEFAULT_NETWORK.maxConcurrentConnections ? { maxConcurrentConnections: network.maxConcurrentConnections } : {}),
    };
  }
  if (network.handles.length > 0) found.handles = [...network.handles];
  if (spec.user === 'root' || spec.user === '0' || spec.user?.startsWith('0:') === true) found.user = 'root';
  if (network.publicPorts.length > 0) found.publicPorts = [...network.publicPorts];
  if (spec.mounts.length > 0) {
    found.mounts = spec.mounts.map((m) => ({ root: m.root, subpath: m.subpath ?? '', sandboxPath: m.sandboxPath, readOnly: m.readOnly }));
  }
  return Object.keys(found).length > 0 ? found : undefined;
}
