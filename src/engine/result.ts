import type { ExecResult } from '../wire/index.js';

/** Bytes of each stream a result carries inline at most (the rest stays on disk, in the log). */
export const RESULT_INLINE_BYTES = 1024 * 1024;

/** How a process ended, without its output: what the server keeps in memory for an ended process. */
export type ProcessEnd = Omit<ExecResult, 'stdout' | 'stderr'>;

export const DIAGNOSTIC_TAIL_LINES = 20;
export const DIAGNOSTIC_TAIL_BYTES = 2048;

/** The last bytes of a stream, whatever the output caps kept of its start. */
export class TailBuffer {
  private chunks: Buffer[] = [];
  private size = 0;

  constructor(private readonly maxBytes = DIAGNOSTIC_TAIL_BYTES) {}

  push(chunk: Buffer): void {
    this.chunks.push(chunk);
    this.size += chunk.length;
    while (this.chunks.length > 1 && this.size - (this.chunks[0]?.length ?? 0) >= this.maxBytes) {
      this.size -= this.chunks.shift()?.length ?? 0;
    }
  }

  /** The last complete lines that fit, at most `DIAGNOSTIC_TAIL_LINES`. */
  lines(): string[] {
    const all = Buffer.concat(this.chunks);
    const tail = all.subarray(Math.max(0, all.length - this.maxBytes));
    const lines = tail.toString('utf8').split('\n');
    if (tail.length < all.length) lines.shift(); // the first line was cut
    while (lines.length > 0 && lines[lines.length - 1]?.trim() === '') lines.pop();
    return lines.slice(-DIAGNOSTIC_TAIL_LINES);
  }
}

/** Where and how an exec failed, for the result's error fields; undefined when it succeeded. */
export function diagnose(result: ExecResult, request: { argv: readonly string[]; cwd?: string }, stderrTail: string[]): string | undefined {
  if (result.outcome === 'ok') return undefined;
  const command = request.argv.map((arg) => (arg.length > 60 ? `${arg.slice(0, 57)}...` : arg)).join(' ').slice(0, 200);
  const how =
    result.outcome === 'limit_exceeded' ? (result.limit?.message ?? 'a limit was exceeded')
    : result.outcome === 'error' ? `${result.error?.code ?? 'error'}: ${result.error?.message ?? ''}`
    : result.signal ? `killed by ${result.signal}` : `exit code ${result.exitCode}`;
  const where = `\`${command}\` in ${request.cwd ?? '/workspace'} ended after ${result.durationMs} ms: ${how}`;
  if (stderrTail.length === 0) return where;
  return `${where}\nlast stderr lines:\n${stderrTail.join('\n')}`;
}
