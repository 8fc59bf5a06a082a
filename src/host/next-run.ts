/**
 * Work done for many callers at once. A caller joins the run that has not started yet, which
 * starts when the one before it has ended, with every item asked until then: each run sees all
 * that was asked before it started (a listing sees every subvolume made before its callers
 * asked), and callers arriving while one runs share the next run instead of each starting one.
 * (InFlight, in the engine, is the other kind: callers share the run already going.)
 */
export class NextRun<T = never> {
  private queued: { items: T[]; run: Promise<void> } | undefined;
  private running: Promise<void> = Promise.resolve();

  constructor(private readonly work: (items: readonly T[]) => Promise<void>) {}

  /** Resolves when the run that takes `items` has ended; rejects with its error. */
  join(...items: T[]): Promise<void> {
    let next = this.queued;
    if (!next) {
      const batch: T[] = [];
      const run = this.running.then(() => {
        this.queued = undefined;
        return this.work(batch);
      });
      next = this.queued = { items: batch, run };
      this.running = run.catch(() => undefined);
    }
    next.items.push(...items);
    return next.run;
  }
}
