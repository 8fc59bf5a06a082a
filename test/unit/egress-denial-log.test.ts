import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { DenialLog, type EgressLogEntry } from '../../src/host/egress/denial-log.js';
import type { EgressEvent } from '../../src/host/egress/egress-proxy.js';

/* Finding 5 of issue 11 (its log part): repeated egress denials are summed, not written one by one. */
const denial = (sandboxId: string, destination: string, rule = 'allowlist'): EgressEvent => ({
  sandboxId, kind: 'blocked', protocol: 'connect', destination, code: 'EGRESS_NOT_ALLOWED', rule, message: `${destination} is not allowed`,
});

let lines: EgressLogEntry[];
let log: DenialLog;
beforeEach(() => {
  vi.useFakeTimers();
  lines = [];
  log = new DenialLog({ write: (e) => lines.push(e), windowMs: 10_000, kindsPerSandbox: 4 });
});
afterEach(() => {
  log.close();
  vi.useRealTimers();
});

describe('denied-egress log lines', () => {
  it('writes the first denial at once and sums 9,999 repeats into one line per window', () => {
    for (let i = 0; i < 10_000; i++) log.record(denial('sb1', 'evil.test:443'));
    expect(lines).toEqual([denial('sb1', 'evil.test:443')]);
    vi.advanceTimersByTime(9_999);
    expect(lines).toHaveLength(1);
    vi.advanceTimersByTime(1);
    expect(lines).toHaveLength(2);
    expect(lines[1]).toMatchObject({
      sandboxId: 'sb1', destination: 'evil.test:443', rule: 'allowlist', repeated: 9_999, windowMs: 10_000,
      message: '9999 more denials of evil.test:443 (allowlist) in the last 10 s',
    });
  });

  it('keeps a steady stream at one line per window, and forgets a kind after a quiet window', () => {
    log.record(denial('sb1', 'evil.test:443'));
    for (let window = 0; window < 3; window++) {
      for (let i = 0; i < 50; i++) log.record(denial('sb1', 'evil.test:443'));
      vi.advanceTimersByTime(10_000);
    }
    expect(lines.map((l) => l.repeated)).toEqual([undefined, 50, 50, 50]);
    vi.advanceTimersByTime(10_000); // quiet: nothing written, the kind is forgotten
    expect(lines).toHaveLength(4);
    log.record(denial('sb1', 'evil.test:443'));
    expect(lines).toHaveLength(5);
    expect(lines[4]?.repeated).toBeUndefined();
    vi.advanceTimersByTime(60_000); // nothing pending: no timer keeps running
    expect(lines).toHaveLength(5);
    expect(vi.getTimerCount()).toBe(0);
  });

  it('tells sandboxes, destinations and rules apart', () => {
    log.record(denial('sb1', 'a.test:443'));
    log.record(denial('sb2', 'a.test:443'));
    log.record(denial('sb1', 'b.test:443'));
    log.record(denial('sb1', 'a.test:443', 'operator-deny:a.test'));
    log.record(denial('sb1', 'a.test:443'));
    expect(lines.map((l) => `${l.sandboxId} ${l.destination} ${l.rule}`)).toEqual([
      'sb1 a.test:443 allowlist', 'sb2 a.test:443 allowlist', 'sb1 b.test:443 allowlist', 'sb1 a.test:443 operator-deny:a.test',
    ]);
    vi.advanceTimersByTime(10_000);
    expect(lines.slice(4).map((l) => `${l.sandboxId} ${l.destination} ${l.repeated}`)).toEqual(['sb1 a.test:443 1']);
    expect(lines[4]?.message).toBe('1 more denial of a.test:443 (allowlist) in the last 10 s');
  });

  it('bounds the lines of a sandbox cycling through random destinations (DNS exfiltration attempts)', () => {
    for (let i = 0; i < 10_000; i++) log.record({ ...denial('sb1', `x${i}.leak.test`, 'dns-allowlist'), protocol: 'dns' });
    log.record(denial('sb2', 'ok.test:443')); // another sandbox still gets its own first line
    expect(lines).toHaveLength(5);
    vi.advanceTimersByTime(10_000);
    expect(lines).toHaveLength(6);
    expect(lines[5]).toMatchObject({ sandboxId: 'sb1', rule: 'many', repeated: 9_996, destination: '(1024+ other destinations)' });
    expect(lines[5]?.message).toBe('9996 denials of 1024+ other destinations in the last 10 s (the last: x9999.leak.test, dns-allowlist)');
  });

  it('writes what is pending on close', () => {
    log.record(denial('sb1', 'a.test:443'));
    log.record(denial('sb1', 'a.test:443'));
    log.close();
    expect(lines.map((l) => l.repeated)).toEqual([undefined, 1]);
    expect(vi.getTimerCount()).toBe(0);
  });
});
