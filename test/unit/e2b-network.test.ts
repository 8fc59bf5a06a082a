import { describe, expect, it } from 'vitest';
import { isSandboxError } from '../../src/errors/index.js';
import { NetworkPolicySchema } from '../../src/sandbox-spec/index.js';
import { e2bNetworkInfo, e2bNetworkPolicy, e2bNetworkUpdate } from '../../src/server/e2b/network.js';

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
    // Closed on purpose: a network reaching nothing, which a later updateNetwork can open.
    expect(e2bNetworkPolicy({ denyOut: ['0.0.0.0/0'] })).toEqual({ mode: 'allowlist', allow: [] });
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

  it('maps allow_internet_access as E2B defines it, where the caller said it', () => {
    expect(e2bNetworkPolicy(undefined, true)).toEqual({ mode: 'internet' });
    expect(e2bNetworkPolicy({ allowOut: ['pypi.org'] }, true)).toEqual({ mode: 'internet' });
    // Deny-all wins over internet access; allowOut entries pass it.
    expect(e2bNetworkPolicy({ denyOut: ['0.0.0.0/0'] }, true)).toEqual({ mode: 'allowlist', allow: [] });
    expect(e2bNetworkPolicy({ allowOut: ['pypi.org'], denyOut: ['0.0.0.0/0'] }, true)).toEqual({ mode: 'allowlist', allow: ['pypi.org'] });
    expect(e2bNetworkPolicy({ allowOut: ['pypi.org'] }, false)).toEqual({ mode: 'allowlist', allow: ['pypi.org'] });
    expect(e2bNetworkPolicy(undefined, false)).toEqual({ mode: 'allowlist', allow: [] });
  });

  it('clears in an update what the update omits, leaving an empty allow list', () => {
    expect(e2bNetworkUpdate({})).toEqual({ mode: 'allowlist', allow: [] });
    expect(e2bNetworkUpdate({ allow_internet_access: true })).toEqual({ mode: 'internet' });
    expect(e2bNetworkUpdate({ allowOut: ['8.8.8.8'] })).toEqual({ mode: 'allowlist', allow: ['8.8.8.8/32'] });
    expect(() => e2bNetworkUpdate({ allow_internet_access: 'yes' })).toThrow(/allow_internet_access/);
    expect(() => e2bNetworkUpdate({ egressProxy: { address: 'proxy:3128' } })).toThrow(/egressProxy/);
  });

  it("reports a sandbox's policy as E2B's getInfo reads it", () => {
    expect(e2bNetworkInfo({ mode: 'internet', allow: [] })).toEqual({ allowInternetAccess: true });
    expect(e2bNetworkInfo({ mode: 'allowlist', allow: ['pypi.org'] })).toEqual({ allowInternetAccess: false, network: { allowOut: ['pypi.org'], denyOut: ['0.0.0.0/0'] } });
    expect(e2bNetworkInfo({ mode: 'none', allow: [] })).toEqual({ allowInternetAccess: false, network: { denyOut: ['0.0.0.0/0'] } });
  });
});
