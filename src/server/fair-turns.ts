/**
 * Requests start in turns, first come first served, with a trip around the event loop between
 * turns (docs/decisions/015-capacity-and-fair-turns.md).
 *
 * Why: Node 20's libuv accepts one connection per event-loop iteration (libuv PR #3696). When
 * every ready request is started in the iteration that read it, a busy server's iterations grow
 * with the number of clients (with 200 keep-alive clients one iteration handles all 200), and a
 * client that opens a new connection waits for its accept behind many such iterations: seconds,
 * while the others cycle fast. Spending at most `budgetMs` of synchronous work on starts per
 * iteration keeps iterations short, so accepts (and reads of new requests) keep coming; the
 * queue in front of the turns serves requests in the order they arrived, whatever their connection.
 */
export interface FairTurnsOptions {
  /**
   * Synchronous time the starts of one turn may take before the rest wait for the next turn; at
   * least one request starts per turn. @default 2
   */
  budgetMs?: number;
  /** Runs `fn` on the next turn of the event loop (after its poll phase). @default setImmediate */
  nextTurn?: (fn: () => void) => void;
  /** @default performance.now */
  now?: () => number;
}

export class FairTurns {
  private readonly budgetMs: number;
  private readonly nextTurn: (fn: () => void) => void;
  private readonly now: () => number;
  /** Waiting starts, oldest first; `head` is the next to go (the array is compacted now and then). */
  private waiting: (() => void)[] = [];
  private head = 0;
  private spentMs = 0;
  private scheduled = false;
  /** A connection was accepted since the last turn: more may wait in the kernel's queue. */
  private accepting = false;

  constructor(options: FairTurnsOptions = {}) {
    this.budgetMs = options.budgetMs ?? 2;
    this.nextTurn = options.nextTurn ?? ((fn) => void setImmediate(fn));
    this.now = options.now ?? (() => performance.now());
  }

  /** Requests waiting for a turn now. */
  get queued(): number {
    return this.waiting.length - this.head;
  }

  /**
   * The server accepted a connection. libuv accepts one per iteration, so while connections
   * arrive each turn starts one request only: the loop comes back to the accept at once, and a
   * burst of new clients is let in within as many short iterations.
   */
  accepted(): void {
    this.accepting = true;
    this.schedule();
  }

  /** Runs `start` now when nobody waits and this turn has budget left, else at its turn. */
  enter(start: () => void): void {
    if (this.queued === 0 && !this.accepting && this.spentMs < this.budgetMs) {
      this.run(start);
      this.schedule();
      return;
    }
    this.waiting.push(start);
    this.schedule();
  }

  private run(start: () => void): void {
    const began = this.now();
    try {
      start();
    } finally {
      this.spentMs += this.now() - began;
    }
  }

  private schedule(): void {
    if (this.scheduled) return;
    this.scheduled = true;
    this.nextTurn(() => this.turn());
  }

  /** A new turn: waiting requests start until the budget is spent (one at least). */
  private turn(): void {
    this.scheduled = false;
    this.spentMs = 0;
    const budgetMs = this.accepting ? 0 : this.budgetMs;
    this.accepting = false;
    let started = 0;
    while (this.queued > 0 && (started === 0 || this.spentMs < budgetMs)) {
      const start = this.waiting[this.head]!;
      this.head++;
      started++;
      try {
        this.run(start);
      } catch (error) {
        // Not this turn's to handle; the others still start.
        queueMicrotask(() => {
          throw error;
        });
      }
    }
    if (this.head > 1024 && this.head * 2 > this.waiting.length) {
      this.waiting = this.waiting.slice(this.head);
      this.head = 0;
    }
    // Another turn for those still waiting, or to renew the budget after this turn's spending.
    if (this.queued > 0 || started > 0) this.schedule();
  }
}
