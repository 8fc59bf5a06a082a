import { describe, expect, it } from 'vitest';
import { isSandboxError } from '../../src/errors/index.js';
import { NetworkPolicySchema } from '../../src/sandbox-spec/index.js';
import { e2bNetworkPolicy } from '../../src/server/e2b/network.js';

function refusal(network: unknown): string {
  try {
    e2bNetworkPolicy(network);
  } catch (error) {
    if (isSandboxError(error)) return `${error.code} ${String(error.details?.field)}`;
    throw error;
  }
  throw new Error('not refused');
}

describe("E2B's network options as Capsule policy", () => {
  it('maps what Capsule enforces exactly', () => {
    expect(e2bNetworkPolicy(undefined)).toBeUndefined();
    expect(e2bNetworkPolicy({})).toBeUndefined();
    expect(e2bNetworkPolicy({ denyOut: ['0.0.0.0/0'] })).toBeUndefined();
    const allowlist = e2bNetworkPolicy({ allowOut: ['pypi.org', '*.pythonhosted.org', '8.8.8.8', '10.1.0.0/16'], denyOut: ['0.0.0.0/0'] });
    expect(allowlist).toEqual({ mode: 'allowlist', allow: ['pypi.org', '*.pythonhosted.org', '8.8.8.8/32', '10.1.0.0/16'] });
    // What it maps to is a valid Capsule policy (the engine still applies the operator's maxima).
    expect(NetworkPolicySchema.safeParse(allowlist).success).toBe(true);
    expect(e2bNetworkPolicy({ allowPublicTraffic: false })).toBeUndefined();
  });

  it('refuses what it cannot honour, naming the field', () => {
    expect(refusal({ denyOut: ['10.0.0.0/8'] })).toBe('INVALID_ARGUMENT network.denyOut');
    expect(refusal({ allowPublicTraffic: true })).toBe('INVALID_ARGUMENT network.allowPublicTraffic');
    expect(refusal({ rules: {} })).toBe('INVALID_ARGUMENT network.rules');
    expect(refusal('everything')).toBe('INVALID_ARGUMENT network');
    expect(refusal({ allowOut: 'pypi.org' })).toBe('INVALID_ARGUMENT network.allowOut');
  });
});
