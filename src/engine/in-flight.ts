/**
 * One run at a time per key: a caller that finds the key's run in flight shares its outcome
 * instead of starting a second one. What makes two deletes of one snapshot (two requests, a
 * retried one) delete its data and give its bytes back to the quota once.
 */
export class InFlight {
  private readonly runs = new Map<string, Promise<void>>();

  has(key: string): boolean {
    return this.runs.has(key);
  }

  run(key: string, work: () => Promise<void>): Promise<void> {
    const known = this.runs.get(key);
    if (known) return known;
    const run = work().finally(() => this.runs.delete(key));
    this.runs.set(key, run);
    return run;
  }
}
