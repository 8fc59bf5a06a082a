import { SandboxError } from '../errors/index.js';
import type { Limits, SandboxSpec } from './schema.js';

const MiB = 1024 * 1024;
const GiB = 1024 * MiB;

/** The operator's ceilings: a spec may lower any limit, and raise it only up to these. */
export interface OperatorMaxima {
  limits: Limits;
  ttlMs: number;
  /** @default DEFAULT_MAXIMA.network */
  network?: NetworkMaxima;
}

/** Ceilings of `network` fields. */
export interface NetworkMaxima {
  /**
   * Highest `network.maxConcurrentConnections` a spec may ask for. The host's nftables also
   * refuse a sandbox's connections to the proxy a little past it, before the proxy accepts them.
   */
  maxConcurrentConnections: number;
}

const DEFAULT_NETWORK_MAXIMA: NetworkMaxima = { maxConcurrentConnections: 1024 };

export const DEFAULT_MAXIMA: OperatorMaxima = {
  limits: {
    cpus: 2,
    wallClockMs: 3_600_000,
    memoryBytes: 8 * GiB,
    memoryWarnRatio: 0.99,
    pids: 4096,
    diskBytes: 16 * GiB,
    fileSizeBytes: 4 * GiB,
    tmpBytes: 2 * GiB,
    shmBytes: 2 * GiB,
    openFiles: 65_536,
    stdoutBytes: 64 * MiB,
    stderrBytes: 64 * MiB,
  },
  ttlMs: 24 * 3_600_000,
  network: DEFAULT_NETWORK_MAXIMA,
};

/** Throws SPEC_EXCEEDS_MAXIMUM naming the first field above the operator's maximum. */
export function checkMaxima(spec: SandboxSpec, maxima: OperatorMaxima = DEFAULT_MAXIMA): void {
  for (const key of Object.keys(maxima.limits) as (keyof Limits)[]) {
    const max = maxima.limits[key];
    const value = spec.limits[key];
    if (value > max) {
      throw new SandboxError('SPEC_EXCEEDS_MAXIMUM', `limits.${key} is ${value}, above the operator maximum ${max}`, {
        details: { field: `limits.${key}`, value, maximum: max },
        hint: `Lower limits.${key} to at most ${max}, or ask the operator to raise the maximum.`,
      });
    }
  }
  const network = maxima.network ?? DEFAULT_NETWORK_MAXIMA;
  if (spec.network.maxConcurrentConnections > network.maxConcurrentConnections) {
    const { maxConcurrentConnections: value } = spec.network;
    const max = network.maxConcurrentConnections;
    throw new SandboxError('SPEC_EXCEEDS_MAXIMUM', `network.maxConcurrentConnections is ${value}, above the operator maximum ${max}`, {
      details: { field: 'network.maxConcurrentConnections', value, maximum: max },
      hint: `Lower network.maxConcurrentConnections to at most ${max} (reuse connections, e.g. HTTP keep-alive), or ask the operator to raise the maximum.`,
    });
  }
  if (spec.ttlMs > maxima.ttlMs) {
    throw new SandboxError('SPEC_EXCEEDS_MAXIMUM', `ttlMs is ${spec.ttlMs}, above the operator maximum ${maxima.ttlMs}`, {
      details: { field: 'ttlMs', value: spec.ttlMs, maximum: maxima.ttlMs },
      hint: `Lower ttlMs to at most ${maxima.ttlMs}.`,
    });
  }
}

/**
 * `limits` lowered to the operator's maxima where they are above them. For the sizes a surface
 * picks on its callers' behalf (the E2B facade's defaults), never for what a caller asked for:
 * that is refused with SPEC_EXCEEDS_MAXIMUM instead.
 */
export function clampLimits(limits: Partial<Limits>, maxima: OperatorMaxima = DEFAULT_MAXIMA): Partial<Limits> {
  const clamped: Partial<Limits> = { ...limits };
  for (const key of Object.keys(limits) as (keyof Limits)[]) {
    const value = limits[key];
    if (value !== undefined && value > maxima.limits[key]) clamped[key] = maxima.limits[key];
  }
  return clamped;
}
