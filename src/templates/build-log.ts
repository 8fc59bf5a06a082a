/** One line of a build's log, as E2B's build status carries it (`logEntries`). */
export interface LogEntry {
  timestamp: string;
  level: 'debug' | 'info' | 'warn' | 'error';
  message: string;
  /** The 1-based step the line belongs to, `base` (FROM, bootstrap, import) or `finalize`. */
  step: string;
}

export type OnLog = (entry: LogEntry) => void;

export interface BuildLogOptions {
  /** Called with every entry as it is written (also those later dropped from the record). */
  onLog?: OnLog;
  /** Entries kept for the build record; the oldest past it are dropped and counted. @default 2000 */
  maxEntries?: number;
  /** Characters of one message kept. @default 4096 */
  maxMessageChars?: number;
  now?: () => Date;
}

/**
 * A build's log: every entry goes to `onLog` live, and a bounded window (the first few entries
 * and the most recent ones) is kept for the build record, so a chatty `apt-get` cannot make a
 * record of unbounded size. How many were dropped is kept too: `inspect` says so.
 */
export class BuildLog {
  private readonly head: LogEntry[] = [];
  private readonly tail: LogEntry[] = [];
  private droppedCount = 0;
  private readonly headSize: number;
  private readonly tailSize: number;
  private readonly maxChars: number;

  constructor(private readonly options: BuildLogOptions = {}) {
    const max = Math.max(2, options.maxEntries ?? 2000);
    this.headSize = Math.min(100, Math.floor(max / 4));
    this.tailSize = max - this.headSize;
    this.maxChars = options.maxMessageChars ?? 4096;
  }

  write(level: LogEntry['level'], step: string, message: string): void {
    const text = message.length > this.maxChars ? `${message.slice(0, this.maxChars)}…` : message;
    const entry: LogEntry = { timestamp: (this.options.now?.() ?? new Date()).toISOString(), level, message: text, step };
    if (this.head.length < this.headSize) this.head.push(entry);
    else {
      this.tail.push(entry);
      if (this.tail.length > this.tailSize) {
        this.tail.shift();
        this.droppedCount++;
      }
    }
    this.options.onLog?.(entry);
  }

  info(step: string, message: string): void {
    this.write('info', step, message);
  }

  /** The kept entries in order. */
  entries(): LogEntry[] {
    return [...this.head, ...this.tail];
  }

  get dropped(): number {
    return this.droppedCount;
  }

  /** The last `count` kept messages of a step, for a failure's message. */
  lastLines(step: string, count: number): string[] {
    return this.entries()
      .filter((entry) => entry.step === step)
      .slice(-count)
      .map((entry) => entry.message);
  }
}
