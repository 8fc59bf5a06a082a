import { z } from 'zod';
import { CapsuleError, Sandbox, type ConnectionOptions, type ExecResult } from '../sdk/index.js';
import { SandboxError } from '../errors/index.js';

/** Output a tool returns per stream; the rest is dropped and the answer says so. @default 32 KiB */
export const TOOL_OUTPUT_BYTES = 32 * 1024;

/** What a tool answers: text for the model, and the same as structured content. */
export interface ToolAnswer {
  [key: string]: unknown;
  content: { type: 'text'; text: string }[];
  structuredContent?: Record<string, unknown>;
  isError?: boolean;
}

export interface ToolDefinition {
  name: string;
  title: string;
  description: string;
  inputSchema: z.ZodRawShape;
  /** Changes something (the MCP hint clients use to ask before calling). */
  mutates: boolean;
  run(args: Record<string, unknown>, connection: ConnectionOptions, handles: SandboxHandles): Promise<Record<string, unknown>>;
}

/** Most sandbox handles kept between tool calls. @default 256 */
const MAX_HANDLES = 256;

/**
 * Connected sandboxes by API key and id, kept between tool calls: a call on a known sandbox
 * skips the lookup `Sandbox.connect` makes (a sandbox gone since is still an error from the call
 * itself). The key is part of the entry's name, so a handle never serves another credential.
 */
export class SandboxHandles {
  private readonly handles = new Map<string, Sandbox>();

  async get(id: unknown, connection: ConnectionOptions): Promise<Sandbox> {
    const key = `${connection.url ?? ''}\0${connection.apiKey ?? ''}\0${String(id)}`;
    const known = this.handles.get(key);
    if (known) return known;
    const sandbox = await Sandbox.connect(String(id), connection);
    if (this.handles.size >= MAX_HANDLES) this.handles.delete(this.handles.keys().next().value ?? '');
    this.handles.set(key, sandbox);
    return sandbox;
  }

  forget(id: unknown, connection: ConnectionOptions): void {
    this.handles.delete(`${connection.url ?? ''}\0${connection.apiKey ?? ''}\0${String(id)}`);
  }
}

const sandboxId = z.string().describe('The sandbox id (from create_sandbox or list_sandboxes)');
const command = z
  .union([z.string(), z.array(z.string()).min(1)])
  .describe('A shell command (run as sh -c COMMAND) or an argv array run directly');

/** Text capped at TOOL_OUTPUT_BYTES, with whether it was cut. */
function capped(text: string): { text: string; truncated: boolean } {
  const bytes = Buffer.from(text, 'utf8');
  if (bytes.length <= TOOL_OUTPUT_BYTES) return { text, truncated: false };
  return { text: bytes.subarray(0, TOOL_OUTPUT_BYTES).toString('utf8'), truncated: true };
}

function execAnswer(result: ExecResult): Record<string, unknown> {
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


/** The tools, with argument names as in the SDK (`sandboxId`, `command`, `path`, …). */
export const TOOLS: readonly ToolDefinition[] = [
  {
    name: 'create_sandbox',
    title: 'Create a sandbox',
    description:
      'Start an isolated Linux sandbox (Python 3 and Node available). Returns its sandboxId, needed by every other tool. ' +
      'No network unless network.mode is "allowlist" (with allow: ["pypi.org", ...]) or "internet" (if the operator permits).',
    inputSchema: {
      template: z.string().optional().describe('Template to start from (default: the host toolchain)'),
      backend: z.enum(['namespace', 'gvisor']).optional().describe('Isolation backend (default namespace)'),
      limits: z
        .object({ memoryBytes: z.number().int().positive().optional(), cpus: z.number().positive().optional(), wallClockMs: z.number().int().positive().optional(), diskBytes: z.number().int().positive().optional() })
        .optional()
        .describe('Resource limits; wallClockMs is the default time limit of each command'),
      network: z
        .object({ mode: z.enum(['none', 'allowlist', 'internet']).optional(), allow: z.array(z.string()).optional(), publicPorts: z.array(z.number().int()).optional() })
        .optional()
        .describe('Outbound network policy, and ports reachable without a token'),
      ttlMs: z.number().int().positive().optional().describe('How long the sandbox lives (default 5 minutes)'),
    },
    mutates: true,
    async run(args, connection) {
      const spec = Object.fromEntries(Object.entries(args).filter(([, value]) => value !== undefined));
      const sandbox = await Sandbox.create(spec, connection);
      return { sandboxId: sandbox.sandboxId, state: sandbox.info.state, backend: sandbox.info.spec.backend, expiresAt: sandbox.info.expiresAt };
    },
  },
  {
    name: 'list_sandboxes',
    title: 'List sandboxes',
    description: 'The sandboxes of this API key\'s tenant that are starting, running or paused.',
    inputSchema: {},
    mutates: false,
    async run(_args, connection) {
      const { sandboxes } = await Sandbox.list({ ...connection, state: ['starting', 'running', 'paused'] });
      return { sandboxes: sandboxes.map((info) => ({ sandboxId: info.sandboxId, state: info.state, createdAt: info.createdAt, metadata: info.metadata })) };
    },
  },
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
        ...(typeof args.cwd === 'string' && { cwd: args.cwd }),
        ...(args.env !== undefined && { env: args.env as Record<string, string> }),
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
      const handle = await sandbox.commands.run(args.command as string | string[], {
        background: true,
        ...(typeof args.cwd === 'string' && { cwd: args.cwd }),
        ...(args.env !== undefined && { env: args.env as Record<string, string> }),
      });
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
        return { running: true, pid: handle.pid, stdout: capped(stdout).text, stderr: capped(stderr).text, stdoutTruncated: capped(stdout).truncated, stderrTruncated: capped(stderr).truncated };
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
  {
    name: 'write_file',
    title: 'Write a file',
    description: 'Create or replace a text file in the sandbox (relative paths are under /workspace; parent directories are made).',
    inputSchema: { sandboxId, path: z.string(), content: z.string() },
    mutates: true,
    async run(args, connection, handles) {
      const sandbox = await handles.get(args.sandboxId, connection);
      const entry = await sandbox.files.write(String(args.path), String(args.content));
      return { path: entry.path, size: entry.size };
    },
  },
  {
    name: 'read_file',
    title: 'Read a file',
    description: `Read a text file from the sandbox (at most ${TOOL_OUTPUT_BYTES} bytes are returned; truncated says when more exists).`,
    inputSchema: { sandboxId, path: z.string() },
    mutates: false,
    async run(args, connection, handles) {
      const sandbox = await handles.get(args.sandboxId, connection);
      const text = (await sandbox.files.read(String(args.path)));
      const content = capped(text);
      return { path: args.path, content: content.text, truncated: content.truncated };
    },
  },
  {
    name: 'list_files',
    title: 'List a directory',
    description: 'Entries of a directory in the sandbox (name, type, size), optionally several levels deep.',
    inputSchema: { sandboxId, path: z.string().optional().describe('Default /workspace'), depth: z.number().int().min(1).max(10).optional() },
    mutates: false,
    async run(args, connection, handles) {
      const sandbox = await handles.get(args.sandboxId, connection);
      const entries = await sandbox.files.list(typeof args.path === 'string' ? args.path : '/workspace', typeof args.depth === 'number' ? { depth: args.depth } : {});
      return { entries: entries.slice(0, 1000).map((e) => ({ path: e.path, type: e.type, size: e.size })), truncated: entries.length > 1000 };
    },
  },
  {
    name: 'port_url',
    title: 'URL of a port',
    description: 'A signed URL (valid one hour) that reaches a server listening on PORT inside the sandbox, over HTTP or WebSocket.',
    inputSchema: { sandboxId, port: z.number().int().min(1).max(65_535) },
    mutates: true,
    async run(args, connection, handles) {
      const sandbox = await handles.get(args.sandboxId, connection);
      const signed = await sandbox.portUrl(Number(args.port));
      return { url: signed.hostUrl ?? signed.url, expiresAt: signed.expiresAt };
    },
  },
  {
    name: 'kill_sandbox',
    title: 'Kill a sandbox',
    description: 'End the sandbox and everything in it; its files are gone. Needs confirm: true.',
    inputSchema: { sandboxId, confirm: z.literal(true).describe('Must be true: killing cannot be undone') },
    mutates: true,
    async run(args, connection, handles) {
      const sandbox = await handles.get(args.sandboxId, connection);
      handles.forget(args.sandboxId, connection);
      const info = await sandbox.kill();
      return { sandboxId: info.sandboxId, state: info.state };
    },
  },
];

/** Runs a tool; a failure is an MCP error result carrying Capsule's code and hint, never a throw. */
export async function callTool(tool: ToolDefinition, args: Record<string, unknown>, connection: ConnectionOptions, handles: SandboxHandles): Promise<ToolAnswer> {
  try {
    const answer = await tool.run(args, connection, handles);
    return { content: [{ type: 'text', text: JSON.stringify(answer, null, 2) }], structuredContent: answer };
  } catch (error) {
    const wire =
      error instanceof SandboxError
        ? error
        : new CapsuleError('INTERNAL', error instanceof Error ? error.message : String(error), { hint: 'Retry; if it persists, report it with the server log.' });
    const structured = { code: wire.code, message: wire.message, ...(wire.hint !== undefined && { hint: wire.hint }), ...(error instanceof CapsuleError && error.requestId !== undefined && { requestId: error.requestId }) };
    const text = `${wire.code}: ${wire.message}${wire.hint !== undefined ? `\nHint: ${wire.hint}` : ''}`;
    return { content: [{ type: 'text', text }], structuredContent: structured, isError: true };
  }
}
