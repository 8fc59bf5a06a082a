import { describe, expect, it } from 'vitest';
import { RANGE_BASE, RANGE_SIZE, UidRanges } from '../../src/host/uid-ranges.js';

describe('UidRanges.claim', () => {
  it('holds a running sandbox\'s range, refuses one held or not a range start, and keeps allocation clear of it', () => {
    const ranges = new UidRanges();
    const base = RANGE_BASE + 7 * RANGE_SIZE;
    expect(ranges.claim('running', base)).toBe(true);
    expect(ranges.claim('running', base)).toBe(true); // already its own
    expect(ranges.claim('other', base)).toBe(false);
    expect(ranges.claim('other', base + 1)).toBe(false);
    expect(ranges.claim('other', RANGE_BASE - RANGE_SIZE)).toBe(false);
    expect(ranges.allocate('running')).toBe(base);
    for (let n = 0; n < 50; n++) expect(ranges.allocate(`new-${n}`)).not.toBe(base);
    ranges.release('running');
    expect(ranges.claim('other', base)).toBe(true);
  });
});
