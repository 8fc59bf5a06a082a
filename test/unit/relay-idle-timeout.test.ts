/**
 * A relay's idle timeout, as node:http's keep-alive agent relies on it (net.Socket semantics):
 * 'timeout' once no byte moved either way for the set time; activity restarts the count; 0 stops
 * it. Fake timers; the relay talks to a recording `send` instead of an agent.
 */
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { AgentRelay } from '../../src/backends/agent/relay.js';
import { FrameType } from '../../src/backends/agent/protocol.js';

beforeEach(() => {
  vi.useFakeTimers();
});

afterEach(() => {
  vi.useRealTimers();
});

function relay(): { relay: AgentRelay; timeouts: () => number } {
  const made = new AgentRelay(1, 8080, () => undefined, () => undefined);
  made.release();
  let count = 0;
  made.on('timeout', () => count++);
  return { relay: made, timeouts: () => count };
}

describe('relay idle timeout', () => {
  it('fires after the set time without activity, and activity either way restarts it', () => {
    const { relay: r, timeouts } = relay();
    r.setTimeout(1000);
    expect(r.timeout).toBe(1000);
    vi.advanceTimersByTime(999);
    expect(timeouts()).toBe(0);
    r.write(Buffer.from('request')); // host → sandbox
    vi.advanceTimersByTime(999);
    expect(timeouts()).toBe(0);
    r.receive({ type: FrameType.RelayFromAgent, id: 1, payload: Buffer.from('answer') }); // sandbox → host
    vi.advanceTimersByTime(999);
    expect(timeouts()).toBe(0);
    vi.advanceTimersByTime(1);
    expect(timeouts()).toBe(1);
    r.destroy();
  });

  it('stops with 0 and with the relay', () => {
    const { relay: r, timeouts } = relay();
    r.setTimeout(1000);
    r.setTimeout(0);
    vi.advanceTimersByTime(5000);
    expect(timeouts()).toBe(0);
    r.setTimeout(1000);
    r.destroy();
    vi.advanceTimersByTime(5000);
    expect(timeouts()).toBe(0);
  });
});
