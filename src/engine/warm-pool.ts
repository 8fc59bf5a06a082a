import type { Backend, BackendSandbox } from '../backends/backend.js';
import type { SandboxSpec } from '../sandbox-spec/index.js';
import { newSandboxId } from './ids.js';
import { PIDS_OUTSIDE_LIMIT } from './admission-ledger.js';
import { baseEnv } from '../host/sandbox-layout.js';
import { SandboxError } from '../errors/index.js';
import type { AgentProcess } from '../backends/agent/index.js';

export interface WarmPoolOptions {
  backend: Backend;
  /** The spec warm sandboxes are started with; others with the same pool key adopt them. */
  spec: SandboxSpec;
  /** Warm sandboxes kept ready. */
  size: number;
  /** The template layer warm sandboxes are made from. @default the host template */
  template?: { layerDir: string };
  /** A refill failed (logged by the owner; the pool retries on the next take). */
  onError?: (error: unknown) => void;
  /**
   * How long after a take the pool starts the replacement. The taker's first calls (a create
   * is followed by an exec) then do not share the host with a launch: on 2 cores a refill
   * started at once tripled the first exec's time (3.0 -> 9.5 ms from a template, 2.4 ms with
   * the wait). @default 100
   */
  refillDelayMs?: number;
}

const DEFAULT_REFILL_DELAY_MS = 100;
/** How long a warm sandbox's first `true` may take before the sandbox is discarded. */
const WARM_UP_TIMEOUT_MS = 5_000;

/**
 * Sandboxes started ahead of time, each used once. Taking one costs a few cgroup writes instead of
 * a launch; the pool refills in the background. A spec the backend cannot pool (network, mounts,
 * other start-time limits) is not served and falls back to a cold start.
 */
export class WarmPool {
  private readonly ready: BackendSandbox[] = [];
  private readonly key: string | undefined;
  private filling = 0;
  private closed = false;
  private readonly pending = new Set<Promise<void>>();
  private refillTimer: NodeJS.Timeout | undefined;
  /** Made, running their warm-up: close() ends them rather than wait for it. */
  private readonly warming = new Set<BackendSandbox>();

  constructor(private readonly options: WarmPoolOptions) {
    this.key = options.backend.poolKey?.(options.spec);
    this.refill();
  }

  /** A warm sandbox re-limited for `spec`, or undefined when none fits or none is ready. */
  async take(spec: SandboxSpec): Promise<BackendSandbox | undefined> {
    if (this.closed || this.key === undefined || this.options.backend.poolKey?.(spec) !== this.key) return undefined;
    const sandbox = this.ready.shift();
    this.refillSoon();
    if (!sandbox?.adopt) return undefined;
    try {
      // The pooled spec itself needs no change; anything else is re-limited in place.
      if (JSON.stringify(spec) !== JSON.stringify(sandbox.spec)) await sandbox.adopt(spec);
      return sandbox;
    } catch (error) {
      this.options.onError?.(error);
      await sandbox.destroy().catch(() => undefined);
      return undefined;
    }
  }

  get size(): number {
    return this.ready.length;
  }

  /** The disk the pool holds on the volume: its warm sandboxes' limits, whether made yet or not. */
  get heldDiskBytes(): number {
    return this.closed ? 0 : this.options.size * this.options.spec.limits.diskBytes;
  }

  /** What the pool holds for admission: its sandboxes' slots, memory and pids limits, made or not yet. */
  get held(): { sandboxes: number; memoryBytes: number; pids: number } {
    if (this.closed) return { sandboxes: 0, memoryBytes: 0, pids: 0 };
    const { size, spec } = this.options;
    // As the admission ledger counts pids: the limit and the launcher outside it.
    return { sandboxes: size, memoryBytes: size * spec.limits.memoryBytes, pids: size * (spec.limits.pids + PIDS_OUTSIDE_LIMIT) };
  }

  /** Destroys the warm sandboxes and waits for refills under way. */
  async close(): Promise<void> {
    this.closed = true;
    clearTimeout(this.refillTimer);
    await Promise.all([...this.warming].map((s) => s.destroy().catch((error: unknown) => this.options.onError?.(error))));
    await Promise.all([...this.pending]);
    await Promise.all(this.ready.splice(0).map((s) => s.destroy().catch((error: unknown) => this.options.onError?.(error))));
  }

  private async warm(sandbox: BackendSandbox): Promise<boolean> {
    this.warming.add(sandbox);
    try {
      return await warmUp(sandbox);
    } finally {
      this.warming.delete(sandbox);
    }
  }

  /** Refills after refillDelayMs; takes meanwhile share the one timer. */
  private refillSoon(): void {
    if (this.refillTimer !== undefined || this.closed) return;
    this.refillTimer = setTimeout(() => {
      this.refillTimer = undefined;
      this.refill();
    }, this.options.refillDelayMs ?? DEFAULT_REFILL_DELAY_MS);
    // A pending refill never keeps a process alive on its own.
    this.refillTimer.unref();
  }

  private refill(): void {
    if (this.key === undefined) return;
    while (!this.closed && this.ready.length + this.filling < this.options.size) {
      this.filling++;
      const task = this.options.backend
        .create(this.options.spec, { id: newSandboxId(), ...(this.options.template ? { template: this.options.template } : {}) })
        .then(
          async (sandbox) => {
            if (this.options.template && !this.closed && !(await this.warm(sandbox))) {
              this.options.onError?.(new SandboxError('INTERNAL', `a warm sandbox's first \`true\` did not end within ${WARM_UP_TIMEOUT_MS} ms; the sandbox was discarded, not offered`));
              return sandbox.destroy();
            }
            if (this.closed) return sandbox.destroy();
            this.ready.push(sandbox);
            // A warm sandbox that dies while it waits is dropped, never handed out.
            void sandbox.lost.then(() => {
              const index = this.ready.indexOf(sandbox);
              if (index >= 0) this.ready.splice(index, 1);
            });
          },
          (error: unknown) => this.options.onError?.(error),
        )
        .finally(() => {
          this.filling--;
          this.pending.delete(task);
        });
      this.pending.add(task);
    }
  }
}

/**
 * Runs `true` once in a warm sandbox from a template before it is offered. Its root is a
 * snapshot of the template, whose files are inodes of their own with nothing in the page cache:
 * the first program run there reads the loader and libc from the volume, on the time of the
 * request that took the sandbox (measured with the refill at once: the first exec 11.7 → 9.5 ms
 * with the warm-up; the refill delay took it to the host template's ~2.5). A template without
 * `true` is offered as it is.
 */
async function warmUp(sandbox: BackendSandbox): Promise<boolean> {
  let child: AgentProcess;
  try {
    child = await sandbox.exec({ argv: ['true'], env: baseEnv(sandbox.spec.template), cwd: '/' });
  } catch {
    // Nothing to run: the first request pays the cold reads, as a cold create does.
    return true;
  }
  // A template's `true` is the template's: whatever it prints is dropped, and one that does not
  // end keeps its sandbox from being offered with it still running.
  child.onStdout(ignore);
  child.onStderr(ignore);
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<false>((resolve) => (timer = setTimeout(() => resolve(false), WARM_UP_TIMEOUT_MS)));
  try {
    return await Promise.race([child.exited.then(() => true), late]);
  } finally {
    clearTimeout(timer);
  }
}

function ignore(): void {}

/** What warm pools hold together, for admission: slots, memory and pids limits. */
export function heldByPools(pools: Iterable<WarmPool>): { sandboxes: number; memoryBytes: number; pids: number } {
  const total = { sandboxes: 0, memoryBytes: 0, pids: 0 };
  for (const pool of pools) {
    const held = pool.held;
    total.sandboxes += held.sandboxes;
    total.memoryBytes += held.memoryBytes;
    total.pids += held.pids;
  }
  return total;
}
