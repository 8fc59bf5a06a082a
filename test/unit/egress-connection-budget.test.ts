import { describe, expect, it } from 'vitest';
import { descriptorBudget, DescriptorBudget, parseOpenFilesLimit } from '../../src/host/egress/connection-limits.js';
import { checkMaxima, DEFAULT_MAXIMA, parseSpec } from '../../src/sandbox-spec/index.js';

/* Finding 3 of issue 11: the arithmetic behind the proxy's bounds, and the spec's limit. */
describe('egress descriptor budget', () => {
  it('reads the soft open-files limit of /proc/self/limits', () => {
    const text = [
      'Limit                     Soft Limit           Hard Limit           Units     ',
      'Max processes             95712                95712                processes ',
      'Max open files            20000                524288               files     ',
    ].join('\n');
    expect(parseOpenFilesLimit(text)).toBe(20000);
    expect(parseOpenFilesLimit(text.replace('20000', 'unlimited'))).toBeUndefined();
    expect(parseOpenFilesLimit('nothing here')).toBeUndefined();
  });

  it('keeps a quarter of the limit (at least 1024, or half a small one) for the rest of the server', () => {
    expect(descriptorBudget(20_000)).toBe(15_000);
    expect(descriptorBudget(1_048_576)).toBe(786_432);
    expect(descriptorBudget(4096)).toBe(3072);
    expect(descriptorBudget(1024)).toBe(512);
    expect(descriptorBudget(20_000, 19_990)).toBe(10);
    expect(descriptorBudget(100, 500)).toBe(0);
  });

  it('counts descriptors taken and given back, never past its total', () => {
    const budget = new DescriptorBudget(2);
    expect([budget.tryTake(), budget.tryTake(), budget.tryTake()]).toEqual([true, true, false]);
    budget.give();
    expect(budget.inUse).toBe(1);
    expect(budget.tryTake()).toBe(true);
  });
});

describe('network.maxConcurrentConnections', () => {
  it('defaults to 256 and is refused above the operator maximum, naming the field', () => {
    expect(parseSpec({ network: { mode: 'allowlist' } }).network.maxConcurrentConnections).toBe(256);
    expect(parseSpec({ network: { mode: 'allowlist', maxConcurrentConnections: 1024 } }).network.maxConcurrentConnections).toBe(1024);
    let error: unknown;
    try {
      parseSpec({ network: { mode: 'allowlist', maxConcurrentConnections: 1025 } });
    } catch (e) {
      error = e;
    }
    expect(error).toMatchObject({ code: 'SPEC_EXCEEDS_MAXIMUM', details: { field: 'network.maxConcurrentConnections', value: 1025, maximum: 1024 } });
    expect((error as Error).message).toBe('network.maxConcurrentConnections is 1025, above the operator maximum 1024');
    // An operator who raises the maximum lets it through; one without network maxima gets the default.
    const spec = parseSpec({ network: { mode: 'allowlist', maxConcurrentConnections: 4000 } }, { ...DEFAULT_MAXIMA, network: { maxConcurrentConnections: 4096 } });
    expect(spec.network.maxConcurrentConnections).toBe(4000);
    expect(() => checkMaxima(spec, { limits: DEFAULT_MAXIMA.limits, ttlMs: DEFAULT_MAXIMA.ttlMs })).toThrow(/above the operator maximum 1024/);
  });
});
