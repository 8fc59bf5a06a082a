import { z } from 'zod';
import { command, sandboxId, type ToolDefinition } from './definition.js';
import { capped, execAnswer, TOOL_OUTPUT_BYTES } from './output.js';

function runOptions(args: Record<string, unknown>): { cwd?: string; env?: Record<string, string> } {
  return {
    ...(typeof args.cwd === 'string' && { cwd: args.cwd }),
    ...(args.env !== undefined && { env: args.env as Record<string, string> }),
  };
}

/** Commands (foreground, or a session: start, poll, stdin, signal) and interpreter code. */
export const COMMAND_TOOLS: readonly ToolDefinition[] = [
  {
    name: 'exec',
    title: 'Run a command',
    description: `Run a command in the sandbox and wait for it (bounded by timeoutMs). Returns exit code and output (each stream capped at ${TOOL_OUTPUT_BYTES} bytes, flagged when cut). For long-running commands use start_command.`,
    inputSchema: {
      sandboxId,
      command,
      cwd: z.string().optional().describe('Working directory (default /workspace)'),
      env: z.record(z.string(), z.string()).optional().describe('Extra environment variables'),
      timeoutMs: z.number().int().positive().optional().describe('Wall-clock limit of the command (default the sandbox\'s, 30 s)'),
    },
    mutates: true,
    async run(args, connection, handles) {
      const sandbox = await handles.get(args.sandboxId, connection);
      const result = await sandbox.commands.run(args.command as string | string[], {
        ...runOptions(args),
        ...(typeof args.timeoutMs === 'number' && { timeoutMs: args.timeoutMs }),
      });
      return execAnswer(result);
    },
  },
  {
    name: 'start_command',
    title: 'Start a long-running command',
    description: 'Start a command in the background (a server, a long build). Returns its pid for wait_command, send_stdin and signal_command.',
    inputSchema: { sandboxId, command, cwd: z.string().optional(), env: z.record(z.string(), z.string()).optional() },
    mutates: true,
    async run(args, connection, handles) {
      const sandbox = await handles.get(args.sandboxId, connection);
      const handle = await sandbox.commands.run(args.command as string | string[], { background: true, ...runOptions(args) });
      return { pid: handle.pid };
    },
  },
  {
    name: 'wait_command',
    title: 'Poll a background command',
    description: 'Wait up to waitMs for a command started with start_command. Returns its result when it ended, else running: true and its output so far.',
    inputSchema: { sandboxId, pid: z.number().int().positive(), waitMs: z.number().int().min(0).max(60_000).optional().describe('How long to wait (default 1000)') },
    mutates: false,
    async run(args, connection, handles) {
      const sandbox = await handles.get(args.sandboxId, connection);
      let stdout = '';
      let stderr = '';
      const stop = new AbortController();
      const handle = await sandbox.commands.connect(Number(args.pid), { signal: stop.signal, onStdout: (data) => (stdout += data), onStderr: (data) => (stderr += data) });
      let timer: NodeJS.Timeout | undefined;
      const timeout = new Promise<undefined>((resolve) => (timer = setTimeout(() => resolve(undefined), typeof args.waitMs === 'number' ? args.waitMs : 1000)));
      try {
        const result = await Promise.race([handle.wait(), timeout]);
        if (result) return { running: false, ...execAnswer(result) };
        const out = capped(stdout);
        const err = capped(stderr);
        return { running: true, pid: handle.pid, stdout: out.text, stderr: err.text, stdoutTruncated: out.truncated, stderrTruncated: err.truncated };
      } finally {
        clearTimeout(timer);
        stop.abort();
        handle.disconnect();
      }
    },
  },
  {
    name: 'send_stdin',
    title: 'Write to a command\'s stdin',
    description: 'Send text to the standard input of a command started with start_command; close: true ends its input.',
    inputSchema: { sandboxId, pid: z.number().int().positive(), data: z.string(), close: z.boolean().optional() },
    mutates: true,
    async run(args, connection, handles) {
      const sandbox = await handles.get(args.sandboxId, connection);
      const handle = await sandbox.commands.connect(Number(args.pid));
      try {
        await handle.sendStdin(String(args.data));
        if (args.close === true) await handle.closeStdin();
      } finally {
        handle.disconnect();
      }
      return { sent: Buffer.byteLength(String(args.data)) };
    },
  },
  {
    name: 'signal_command',
    title: 'Signal a command',
    description: 'Send a signal to a command (SIGTERM to ask it to stop, SIGKILL to end it, SIGINT like Ctrl-C).',
    inputSchema: { sandboxId, pid: z.number().int().positive(), signal: z.enum(['SIGTERM', 'SIGKILL', 'SIGINT', 'SIGHUP']).optional().describe('Default SIGTERM') },
    mutates: true,
    async run(args, connection, handles) {
      const sandbox = await handles.get(args.sandboxId, connection);
      await sandbox.commands.kill(Number(args.pid), (args.signal as NodeJS.Signals | undefined) ?? 'SIGTERM');
      return { signalled: true };
    },
  },
  {
    name: 'run_code',
    title: 'Run code in an interpreter',
    description: 'Run Python or JavaScript in a context that keeps variables between calls (like a notebook). Returns output, results and the error if the code raised.',
    inputSchema: {
      sandboxId,
      code: z.string(),
      language: z.enum(['python', 'javascript', 'typescript']).optional().describe('Default python'),
      contextId: z.string().optional().describe('A context from an earlier call; default the language\'s default context'),
      timeoutMs: z.number().int().positive().optional(),
    },
    mutates: true,
    async run(args, connection, handles) {
      const sandbox = await handles.get(args.sandboxId, connection);
      const execution = await sandbox.runCode(String(args.code), {
        ...(typeof args.language === 'string' && { language: args.language as 'python' }),
        ...(typeof args.contextId === 'string' && { contextId: args.contextId }),
        ...(typeof args.timeoutMs === 'number' && { timeoutMs: args.timeoutMs }),
      });
      const stdout = capped(execution.stdout.join(''));
      const stderr = capped(execution.stderr.join(''));
      return {
        stdout: stdout.text,
        stderr: stderr.text,
        stdoutTruncated: stdout.truncated || execution.stdoutTruncated === true,
        stderrTruncated: stderr.truncated || execution.stderrTruncated === true,
        results: execution.results.map((result) => ({ text: result.text })),
        ...(execution.error && { error: execution.error }),
        ...(execution.limit && { limit: execution.limit }),
      };
    },
  },
];
