import { describe, expect, it } from 'vitest';
import { linkedSignal } from '../../src/server/linked-signal.js';

describe('linkedSignal', () => {
  it('aborts with whichever signal aborts first, with its reason', () => {
    const request = new AbortController();
    const server = new AbortController();
    const { signal } = linkedSignal(request.signal, server.signal);
    expect(signal.aborted).toBe(false);
    server.abort(new Error('server closing'));
    expect(signal.aborted).toBe(true);
    expect((signal.reason as Error).message).toBe('server closing');
    request.abort(new Error('later'));
    expect((signal.reason as Error).message).toBe('server closing');
  });

  it('is aborted at once when one of them already is', () => {
    const server = new AbortController();
    server.abort('gone');
    expect(linkedSignal(new AbortController().signal, server.signal).signal.reason).toBe('gone');
  });

  it('after release, follows neither: the long-lived signal keeps no listener of it', () => {
    const request = new AbortController();
    const server = new AbortController();
    let listeners = 0;
    const add = server.signal.addEventListener.bind(server.signal);
    const remove = server.signal.removeEventListener.bind(server.signal);
    server.signal.addEventListener = ((...args: Parameters<AbortSignal['addEventListener']>) => (listeners++, add(...args)));
    server.signal.removeEventListener = ((...args: Parameters<AbortSignal['removeEventListener']>) => (listeners--, remove(...args)));
    const { signal, release } = linkedSignal(request.signal, server.signal);
    expect(listeners).toBe(1);
    release();
    expect(listeners).toBe(0);
    server.abort();
    expect(signal.aborted).toBe(false);
  });
});
