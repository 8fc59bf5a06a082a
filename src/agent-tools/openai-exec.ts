import type { CommandHandle, ExecResult, Sandbox } from '../sdk/index.js';
import { TOOL_OUTPUT_BYTES } from './output.js';

/** How long exec_command waits for a command before it answers with a session id. @default 10 s */
export const DEFAULT_EXEC_YIELD_MS = 10_000;
/** How long write_stdin waits for more output. @default 250 ms */
export const DEFAULT_STDIN_YIELD_MS = 250;
/** Bytes per token the Agents SDK's own sessions assume when they cap output. */
const BYTES_PER_TOKEN = 4;

/** A command exec_command started and the model may poll or feed (write_stdin). */
export interface LiveCommand {
  handle: CommandHandle;
  /** Output not yet returned to the model, both streams as they came. */
  unread: string;
  stdout: string;
  stderr: string;
  result: ExecResult | undefined;
  ended: Promise<ExecResult>;
}

/** What one exec_command or write_stdin answers, before it is rendered as text. */
export interface ExecTurn {
  output: string;
  stdout: string;
  stderr: string;
  wallTimeSeconds: number;
  exitCode?: number | null;
  sessionId?: number;
  originalTokenCount?: number;
}

/** Starts `argv` in the background, collecting its output for the turns that read it. */
export async function startCommand(sandbox: Sandbox, argv: string[], options: { cwd: string; env: Record<string, string> }): Promise<LiveCommand> {
  const live = { unread: '', stdout: '', stderr: '', result: undefined } as LiveCommand;
  live.handle = await sandbox.commands.run(argv, {
    background: true,
    stdin: true,
    cwd: options.cwd,
    env: options.env,
    onStdout: (data) => {
      live.stdout += data;
      live.unread += data;
    },
    onStderr: (data) => {
      live.stderr += data;
      live.unread += data;
    },
  });
  live.ended = live.handle.wait().then((result) => (live.result = result));
  // An ended stream is read through `ended` by the next turn; a failure is its answer there.
  live.ended.catch(() => undefined);
  return live;
}

/** Waits up to `yieldMs` for the command to end. */
export async function waitOrYield(live: LiveCommand, yieldMs: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([live.ended.then(() => undefined), new Promise<void>((resolve) => (timer = setTimeout(resolve, yieldMs)))]);
  clearTimeout(timer);
}

/** The output the model has not seen, capped at maxOutputTokens (or TOOL_OUTPUT_BYTES) and marked where cut. */
export function takeOutput(live: LiveCommand, maxOutputTokens: number | undefined): { output: string; originalTokenCount?: number } {
  let text = live.unread;
  // A limit that ended the command is said in its output, where the model looks.
  if (live.result?.limit !== undefined) text += `${text === '' || text.endsWith('\n') ? '' : '\n'}[capsule: ${live.result.limit.message}]\n`;
  live.unread = '';
  const budget = maxOutputTokens === undefined ? TOOL_OUTPUT_BYTES : Math.max(0, maxOutputTokens) * BYTES_PER_TOKEN;
  const bytes = Buffer.from(text, 'utf8');
  if (bytes.length <= budget) return { output: text };
  // Head and tail: a command's last lines (its error, its summary) matter as much as its first.
  const half = Math.floor(budget / 2);
  const cut = bytes.length - 2 * half;
  const output = `${bytes.subarray(0, half).toString('utf8')}\n…[${cut} bytes of output cut]…\n${bytes.subarray(bytes.length - half).toString('utf8')}`;
  return { output, originalTokenCount: Math.ceil(bytes.length / BYTES_PER_TOKEN) };
}

/** A turn as the model reads it, in the layout of the Agents SDK's own sandboxes. */
export function renderTurn(turn: ExecTurn): string {
  const lines = [`Wall time: ${turn.wallTimeSeconds.toFixed(4)} seconds`];
  if (typeof turn.sessionId === 'number') lines.push(`Process running with session ID ${turn.sessionId}`);
  else if (typeof turn.exitCode === 'number') lines.push(`Process exited with code ${turn.exitCode}`);
  if (typeof turn.originalTokenCount === 'number') lines.push(`Original token count: ${turn.originalTokenCount}`);
  lines.push('Output:', turn.output);
  return lines.join('\n');
}
