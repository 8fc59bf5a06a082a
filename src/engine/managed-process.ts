import { SandboxError } from '../errors/index.js';
import type { AgentProcess } from '../backends/agent/index.js';
import type { ExecResult } from '../wire/index.js';
import type { ProcessEvent, ProcessHandle } from './types.js';
import type { ProcessInfo } from '../wire/index.js';

/**
 * A process's event log: every event is kept (output only up to the sandbox's caps, like the
 * result) so a reader that attaches late, even after the exit, replays the whole story.
 */
export class ManagedProcess implements ProcessHandle {
  readonly info: ProcessInfo;
  readonly result: Promise<ExecResult>;
  private readonly log: ProcessEvent[] = [];
  private readonly waiters = new Set<() => void>();
  private readonly keptBytes = { stdout: 0, stderr: 0 };
  private agent: AgentProcess | undefined;

  constructor(
    info: Omit<ProcessInfo, 'pid' | 'running'>,
    private readonly caps: { stdoutBytes: number; stderrBytes: number },
    result: Promise<ExecResult>,
  ) {
    this.info = { ...info, pid: 0, running: true };
    this.result = result.then(
      (r) => {
        this.info.running = false;
        this.push({ type: 'exit', result: r });
        return r;
      },
      (error: unknown) => {
        this.info.running = false;
        throw error;
      },
    );
    this.result.catch(() => undefined);
  }

  get pid(): number {
    return this.info.pid;
  }

  /** Called once the agent reports the process started. */
  started(agent: AgentProcess): void {
    this.agent = agent;
    this.info.pid = agent.pid;
    this.push({ type: 'start', pid: agent.pid });
  }

  output(stream: 'stdout' | 'stderr', data: Buffer): void {
    const cap = stream === 'stdout' ? this.caps.stdoutBytes : this.caps.stderrBytes;
    const room = cap - this.keptBytes[stream];
    if (room <= 0) return;
    const part = data.length <= room ? data : data.subarray(0, room);
    this.keptBytes[stream] += part.length;
    this.push({ type: stream, data: part });
  }

  push(event: ProcessEvent): void {
    this.log.push(event);
    for (const wake of this.waiters) wake();
    this.waiters.clear();
  }

  async *events(signal?: AbortSignal): AsyncIterable<ProcessEvent> {
    let index = 0;
    for (;;) {
      while (index < this.log.length) {
        const event = this.log[index++]!;
        yield event;
        if (event.type === 'exit') return;
      }
      if (signal?.aborted) return;
      // One abort listener per wait, removed when an event comes: a long stream must not pile
      // them up on the request's signal.
      await new Promise<void>((resolve) => {
        const onAbort = (): void => resolve();
        this.waiters.add(() => {
          signal?.removeEventListener('abort', onAbort);
          resolve();
        });
        signal?.addEventListener('abort', onAbort, { once: true });
      });
    }
  }

  writeStdin(data: Buffer | string): void {
    this.running().write(data);
  }

  closeStdin(): void {
    this.running().closeStdin();
  }

  signal(signal: NodeJS.Signals): void {
    this.running().signal(signal);
  }

  resize(cols: number, rows: number): void {
    this.running().resize(cols, rows);
  }

  private running(): AgentProcess {
    if (!this.agent || !this.info.running) {
      throw new SandboxError('PROCESS_NOT_FOUND', `process ${this.info.pid} is not running`, {
        details: { pid: this.info.pid },
        hint: 'Read its events to get the exit; start a new process to continue.',
      });
    }
    return this.agent;
  }
}
