import type { ExecResult } from '../sdk/index.js';

/** Output a tool returns per stream; the rest is dropped and the answer says so. @default 32 KiB */
export const TOOL_OUTPUT_BYTES = 32 * 1024;

/** Text capped at TOOL_OUTPUT_BYTES, with whether it was cut. */
export function capped(text: string): { text: string; truncated: boolean } {
  const bytes = Buffer.from(text, 'utf8');
  if (bytes.length <= TOOL_OUTPUT_BYTES) return { text, truncated: false };
  return { text: bytes.subarray(0, TOOL_OUTPUT_BYTES).toString('utf8'), truncated: true };
}

/** A command's result as a tool answers it: capped streams, flagged when cut either way. */
export function execAnswer(result: ExecResult): Record<string, unknown> {
  const stdout = capped(result.stdout);
  const stderr = capped(result.stderr);
  return {
    outcome: result.outcome,
    exitCode: result.exitCode,
    stdout: stdout.text,
    stderr: stderr.text,
    // Cut by the sandbox's own output limit or by this tool's cap: either way the model is told.
    stdoutTruncated: stdout.truncated || result.stdoutTruncated,
    stderrTruncated: stderr.truncated || result.stderrTruncated,
    ...(result.limit && { limit: result.limit }),
  };
}
