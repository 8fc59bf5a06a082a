import { describe, expect, it } from 'vitest';
import { FairTurns } from '../../src/server/fair-turns.js';

/** A hand-driven event loop: `turn()` runs what was scheduled for the next iteration. */
function fakeLoop() {
  let pending: (() => void)[] = [];
  let clock = 0;
  return {
    nextTurn: (fn: () => void) => void pending.push(fn),
    now: () => clock,
    spend: (ms: number) => void (clock += ms),
    turn() {
      const due = pending;
      pending = [];
      for (const fn of due) fn();
    },
    get scheduled() {
      return pending.length;
    },
  };
}

describe('FairTurns', () => {
  it('starts a request at once on an idle server, and settles with nothing scheduled', () => {
    const loop = fakeLoop();
    const turns = new FairTurns({ budgetMs: 2, nextTurn: loop.nextTurn, now: loop.now });
    const started: string[] = [];
    turns.enter(() => started.push('a'));
    expect(started).toEqual(['a']);
    loop.turn(); // renews the budget
    loop.turn();
    expect(loop.scheduled).toBe(0);
  });

  it('spends at most the budget per turn and serves the rest first come first served', () => {
    const loop = fakeLoop();
    const turns = new FairTurns({ budgetMs: 2, nextTurn: loop.nextTurn, now: loop.now });
    const started: number[] = [];
    // Each start takes 1 ms of synchronous work.
    for (let i = 0; i < 7; i++) turns.enter(() => (started.push(i), loop.spend(1)));
    expect(started).toEqual([0, 1]);
    expect(turns.queued).toBe(5);
    loop.turn();
    expect(started).toEqual([0, 1, 2, 3]);
    // A request that arrives now queues behind those that waited before it.
    turns.enter(() => (started.push(99), loop.spend(1)));
    loop.turn();
    loop.turn();
    loop.turn();
    expect(started).toEqual([0, 1, 2, 3, 4, 5, 6, 99]);
    expect(turns.queued).toBe(0);
  });

  it('starts one request per turn while connections are being accepted, so the loop comes back to the accept', () => {
    const loop = fakeLoop();
    const turns = new FairTurns({ budgetMs: 100, nextTurn: loop.nextTurn, now: loop.now });
    const started: number[] = [];
    turns.accepted();
    for (let i = 0; i < 3; i++) turns.enter(() => started.push(i));
    expect(started).toEqual([]); // a connection was just accepted: even cheap starts wait
    turns.accepted();
    loop.turn();
    expect(started).toEqual([0]);
    loop.turn(); // no accept since the last turn: the whole budget again
    expect(started).toEqual([0, 1, 2]);
  });

  it('keeps serving the others when one start throws', async () => {
    const loop = fakeLoop();
    const turns = new FairTurns({ budgetMs: 0, nextTurn: loop.nextTurn, now: loop.now });
    const started: string[] = [];
    turns.enter(() => started.push('first'));
    turns.enter(() => {
      throw new Error('boom');
    });
    turns.enter(() => started.push('third'));
    const uncaught = new Promise<unknown>((resolve) => {
      const original = globalThis.queueMicrotask;
      globalThis.queueMicrotask = (fn) => {
        globalThis.queueMicrotask = original;
        try {
          fn();
        } catch (error) {
          resolve(error);
        }
      };
    });
    loop.turn();
    loop.turn();
    loop.turn();
    expect(started).toEqual(['first', 'third']);
    expect(String(await uncaught)).toContain('boom');
  });
});
