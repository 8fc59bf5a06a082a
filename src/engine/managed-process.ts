import { SandboxError } from '../errors/index.js';
import type { AgentProcess } from '../backends/agent/index.js';
import type { OutputStream } from './output-log.js';
import { ProcessOutput, type LogExtent } from './process-output.js';
import { RESULT_INLINE_BYTES, type ProcessEnd } from './result.js';
import { untilAborted } from './until-aborted.js';
import type { ProcessEvent, ProcessHandle } from './types.js';
import type { ExecResult, ProcessInfo, Warning } from '../wire/index.js';

type Caps = { stdoutBytes: number; stderrBytes: number };

/**
 * What is left of an ended process once its log is closed: enough to replay its events and give
 * its result from the log, with nothing of it in the heap (the engine writes these to disk for an
 * ended sandbox and reads them back on demand).
 */
export interface EndedProcessRecord {
  info: ProcessInfo;
  caps: Caps;
  isPty: boolean;
  kept: { stdout: number; stderr: number };
  keptEnd: number;
  warnings: { pos: number; warning: Warning }[];
  end: ProcessEnd;
  /** Where its log's records are (absent: it never started, so it logged nothing). */
  log?: LogExtent;
}

/**
 * A process and its replayable events. Its output goes to its log on disk (ProcessOutput), which
 * is where a reader that attaches late, even after the exit, replays it from; the heap keeps only
 * the small events (start, warnings with their place in the output, how it ended). Output is
 * kept up to the sandbox's caps, like the result; a result carries at most 1 MiB of each stream
 * inline, read back from the log.
 */
export class ManagedProcess implements ProcessHandle {
  readonly info: ProcessInfo;
  /** How the process ended, without its output. */
  readonly ended: Promise<ProcessEnd>;
  private readonly kept = { stdout: 0, stderr: 0 };
  private readonly written = { stdout: 0, stderr: 0 };
  private readonly closedKept = { stdout: false, stderr: false };
  /** Log position just past the last kept byte: a replay reads no further. */
  private keptEnd = 0;
  private readonly warnings: { pos: number; warning: Warning }[] = [];
  private end: ProcessEnd | undefined;
  /** While it runs: an ended process lets go of its agent (and the sandbox's pipes behind it). */
  private agent: AgentProcess | undefined;
  private hasStarted = false;
  private log: ProcessOutput | undefined;
  private readonly startedOrEnded: Promise<void>;
  private markStarted: () => void = () => undefined;

  constructor(
    info: Omit<ProcessInfo, 'pid' | 'running'>,
    private readonly caps: Caps,
    result: Promise<ExecResult>,
    /** Started with a terminal: its output is the terminal's. */
    readonly isPty = false,
  ) {
    this.info = { ...info, pid: 0, running: true };
    this.ended = result.then(
      (r) => {
        this.info.running = false;
        this.agent = undefined;
        this.end = this.endOf(r);
        this.log?.notify();
        return this.end;
      },
      (error: unknown) => {
        this.info.running = false;
        this.agent = undefined;
        this.log?.notify();
        throw error;
      },
    );
    this.ended.catch(() => undefined);
    const started = new Promise<void>((resolve) => (this.markStarted = resolve));
    this.startedOrEnded = Promise.race([started, this.ended.then(() => undefined, () => undefined)]);
  }

  /** An ended process from its record, its log read back from `logPath`: it replays and gives its result as it did. */
  static fromRecord(record: EndedProcessRecord, logPath: string): ManagedProcess {
    const process = new ManagedProcess(record.info, record.caps, Promise.resolve({ ...record.end, stdout: '', stderr: '' }), record.isPty);
    process.info.pid = record.info.pid;
    process.info.running = false;
    process.end = record.end;
    process.hasStarted = record.log !== undefined;
    if (record.log) process.log = ProcessOutput.ofClosed(logPath, record.log);
    process.kept.stdout = record.kept.stdout;
    process.kept.stderr = record.kept.stderr;
    process.keptEnd = record.keptEnd;
    process.warnings.push(...record.warnings);
    // Its `ended` settles after these are set, to `endOf` of the recorded end, which is that end
    // (its byte counts are already the larger of reported and written; its truncation flags follow).
    return process;
  }

  get pid(): number {
    return this.info.pid;
  }

  /** Its record once it ended (take it once its log is closed); undefined while it runs, when it ended without a result, or when its log failed. */
  record(): EndedProcessRecord | undefined {
    // A log whose write failed served the rest from memory: read back, it would replay less.
    if (this.info.running || !this.end || this.log?.failed) return undefined;
    return {
      info: { ...this.info },
      caps: { stdoutBytes: this.caps.stdoutBytes, stderrBytes: this.caps.stderrBytes },
      isPty: this.isPty,
      kept: { ...this.kept },
      keptEnd: this.keptEnd,
      warnings: [...this.warnings],
      end: this.end,
      ...(this.log ? { log: this.log.extent } : {}),
    };
  }

  /** The result with up to 1 MiB of each stream inline, read back from the log (each access reads anew). */
  get result(): Promise<ExecResult> {
    return this.ended.then(async (end) => this.resultOf(end, await this.inlineOutput()));
  }

  /** Called once the agent reports the process started, with the log its output goes to. */
  started(agent: AgentProcess, log: ProcessOutput): void {
    this.agent = agent;
    this.hasStarted = true;
    this.log = log;
    this.info.pid = agent.pid;
    this.markStarted();
  }

  /** Every chunk the process writes: kept up to the cap (and logged), the rest logged while there is room. */
  output(stream: OutputStream, data: Buffer): void {
    this.written[stream] += data.length;
    const log = this.log;
    if (!log) return;
    const cap = stream === 'stdout' ? this.caps.stdoutBytes : this.caps.stderrBytes;
    const room = this.closedKept[stream] ? 0 : Math.max(0, cap - this.kept[stream]);
    const keptPart = data.length <= room ? data : data.subarray(0, room);
    if (keptPart.length > 0) {
      if (log.append(stream, keptPart, true)) {
        this.kept[stream] += keptPart.length;
        this.keptEnd = log.position;
      } else {
        this.closedKept[stream] = true; // no room in the log: what is kept ends here, and is flagged
      }
    }
    if (keptPart.length < data.length) log.append(stream, data.subarray(keptPart.length), false);
  }

  warn(warning: Warning): void {
    this.warnings.push({ pos: this.log?.position ?? 0, warning });
    this.log?.notify();
  }

  /** Every event from the start (kept output read back from the log), then live ones, ending with `exit`. */
  async *events(signal?: AbortSignal): AsyncIterable<ProcessEvent> {
    await untilAborted(this.startedOrEnded, signal);
    if (signal?.aborted) return;
    if (this.hasStarted) yield { type: 'start', pid: this.info.pid };
    const inline = new InlineOutput();
    const counts = { stdout: 0, stderr: 0 };
    let next = 0; // the next warning to deliver
    let pos = 0;
    const log = this.log;
    if (log) {
      for await (const piece of log.read(() => (this.end ? this.keptEnd : undefined), signal)) {
        pos = piece.pos;
        let data = piece.data;
        for (;;) {
          while (next < this.warnings.length && this.warnings[next]!.pos <= pos) yield { type: 'warning', warning: this.warnings[next++]!.warning };
          if (data.length === 0) break;
          // Output up to the next warning's place, so a replay has the warning where it happened.
          const at = this.warnings[next]?.pos;
          const cut = at !== undefined && at < pos + data.length ? at - pos : data.length;
          const part = this.keptOf(piece.stream, data.subarray(0, cut), counts);
          if (part.length > 0) {
            inline.add(piece.stream, part);
            yield { type: piece.stream, data: part };
          }
          pos += cut;
          data = data.subarray(cut);
        }
      }
    }
    if (signal?.aborted) return;
    const end = await untilAborted(this.ended, signal);
    if (!end) return;
    while (next < this.warnings.length) yield { type: 'warning', warning: this.warnings[next++]!.warning };
    yield { type: 'exit', result: this.resultOf(end, inline) };
  }

  /** Flushes the log, so that a reader of the file sees all output so far. */
  async flushLog(): Promise<void> {
    await this.log?.flush();
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

  /** The part of `data` (the next bytes of `stream` in the log) within the stream's cap. */
  private keptOf(stream: OutputStream, data: Buffer, counts: { stdout: number; stderr: number }): Buffer {
    const cap = stream === 'stdout' ? this.caps.stdoutBytes : this.caps.stderrBytes;
    const room = Math.max(0, cap - counts[stream]);
    counts[stream] += data.length;
    return data.length <= room ? data : data.subarray(0, room);
  }

  /** The first bytes of each stream's kept output, read from the log; stops once both are full. */
  private async inlineOutput(): Promise<InlineOutput> {
    const inline = new InlineOutput();
    if (!this.log) return inline;
    const counts = { stdout: 0, stderr: 0 };
    for await (const piece of this.log.read(() => this.keptEnd)) {
      inline.add(piece.stream, this.keptOf(piece.stream, piece.data, counts));
      if (inline.holds(this.kept)) break;
    }
    return inline;
  }

  private endOf(r: ExecResult): ProcessEnd {
    const { stdout: _stdout, stderr: _stderr, ...end } = r;
    return {
      ...end,
      stdoutBytes: Math.max(r.stdoutBytes, this.written.stdout),
      stderrBytes: Math.max(r.stderrBytes, this.written.stderr),
      stdoutTruncated: this.kept.stdout < Math.max(r.stdoutBytes, this.written.stdout),
      stderrTruncated: this.kept.stderr < Math.max(r.stderrBytes, this.written.stderr),
    };
  }

  private resultOf(end: ProcessEnd, inline: InlineOutput): ExecResult {
    return {
      ...end,
      stdout: inline.text('stdout'),
      stderr: inline.text('stderr'),
      ...(this.kept.stdout > inline.bytes.stdout ? { stdoutInlineTruncated: true } : {}),
      ...(this.kept.stderr > inline.bytes.stderr ? { stderrInlineTruncated: true } : {}),
    };
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

/** The first RESULT_INLINE_BYTES of each stream. */
class InlineOutput {
  readonly bytes = { stdout: 0, stderr: 0 };
  private readonly chunks: Record<OutputStream, Buffer[]> = { stdout: [], stderr: [] };

  add(stream: OutputStream, data: Buffer): void {
    const room = RESULT_INLINE_BYTES - this.bytes[stream];
    if (room <= 0 || data.length === 0) return;
    const part = data.length <= room ? data : data.subarray(0, room);
    // A copy: a slice would keep the whole chunk it came from alive.
    this.chunks[stream].push(Buffer.from(part));
    this.bytes[stream] += part.length;
  }

  /** Whether it holds as much of each stream as a result carries of `kept` bytes. */
  holds(kept: { stdout: number; stderr: number }): boolean {
    return this.bytes.stdout >= Math.min(RESULT_INLINE_BYTES, kept.stdout) && this.bytes.stderr >= Math.min(RESULT_INLINE_BYTES, kept.stderr);
  }

  text(stream: OutputStream): string {
    return Buffer.concat(this.chunks[stream]).toString('utf8');
  }
}
