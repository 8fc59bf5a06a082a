/**
 * Runs the real capsule-agent (compiled here with gcc) directly under node, not sandboxed, and
 * drives every operation through AgentClient. Pids are therefore host pids.
 */
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PassThrough } from 'node:stream';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { AgentClient, type AgentProcess, type AgentStartOptions } from '../../src/backends/agent/index.js';
import { encodeFrame, FrameType, HEADER_BYTES } from '../../src/backends/agent/protocol.js';
import { isSandboxError } from '../../src/errors/index.js';
import { buildAgent } from '../helpers/agent-binary.js';

const ENV = { PATH: '/usr/local/bin:/usr/bin:/bin', LANG: 'C' };

let buildDir = '';
let agentPath = '';

interface RunningAgent {
  child: ChildProcessWithoutNullStreams;
  client: AgentClient;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  stderr: () => string;
}
const agents: RunningAgent[] = [];

function startAgent(): RunningAgent {
  const child = spawn(agentPath, [], { stdio: ['pipe', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.on('exit', (code, signal) => resolve({ code, signal })),
  );
  const agent = { child, client: new AgentClient(child.stdin, child.stdout), exited, stderr: () => stderr };
  agents.push(agent);
  return agent;
}

async function rssKiB(pid: number | undefined): Promise<number> {
  const status = await readFile(`/proc/${pid}/status`, 'utf8');
  return Number(/VmRSS:\s+(\d+) kB/.exec(status)?.[1]);
}

async function readyAgent(): Promise<RunningAgent> {
  const agent = startAgent();
  await agent.client.ready;
  return agent;
}

function options(argv: string[], extra: Partial<AgentStartOptions> = {}): AgentStartOptions {
  return { argv, env: ENV, cwd: '/', ...extra };
}

/** Collects a process's output from the moment it started. */
function collect(proc: AgentProcess): { stdout: () => string; stderr: () => string; stdoutBytes: () => Buffer } {
  const out: Buffer[] = [];
  const err: Buffer[] = [];
  proc.onStdout((chunk) => out.push(chunk));
  proc.onStderr((chunk) => err.push(chunk));
  return {
    stdout: () => Buffer.concat(out).toString(),
    stderr: () => Buffer.concat(err).toString(),
    stdoutBytes: () => Buffer.concat(out),
  };
}

/** Resolves once the process's stdout so far matches `pattern`. */
function stdoutMatching(proc: AgentProcess, pattern: RegExp): Promise<RegExpMatchArray> {
  return new Promise((resolve, reject) => {
    let text = '';
    proc.onStdout((chunk) => {
      text += chunk.toString();
      const match = pattern.exec(text);
      if (match) resolve(match);
    });
    void proc.exited.then(() => reject(new Error(`process exited before printing ${String(pattern)}; got ${JSON.stringify(text)}`)));
  });
}

async function run(client: AgentClient, argv: string[], extra: Partial<AgentStartOptions> = {}) {
  const proc = await client.start(options(argv, extra));
  const output = collect(proc);
  const exit = await proc.exited;
  return { exit, stdout: output.stdout(), stderr: output.stderr(), stdoutBytes: output.stdoutBytes() };
}

function isRunning(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/**
 * Polls a condition that has no event to wait on (another process disappearing). The deadline is
 * reached only by a failure: generous, so a busy machine (2 shared cores) cannot trip it.
 */
async function waitFor(condition: () => boolean, { timeoutMs = 30_000 } = {}): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`condition not met within ${timeoutMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

async function rejection(promise: Promise<unknown>): Promise<unknown> {
  try {
    await promise;
  } catch (error) {
    return error;
  }
  throw new Error('expected a rejection');
}

beforeAll(async () => {
  buildDir = await mkdtemp(join(tmpdir(), 'capsule-agent-test-'));
  agentPath = await buildAgent(buildDir);
});

afterEach(async (context) => {
  for (const agent of agents.splice(0)) {
    if (agent.child.exitCode === null && agent.child.signalCode === null) {
      agent.client.close();
      const timedOut = await Promise.race([
        agent.exited.then(() => false),
        new Promise<boolean>((resolve) => setTimeout(() => resolve(true), 5000).unref()),
      ]);
      if (timedOut && agent.child.pid !== undefined) process.kill(agent.child.pid, 'SIGKILL');
    }
    if (context.task.result?.state === 'fail') console.error(`agent ${agent.child.pid} stderr:\n${agent.stderr()}`);
  }
});

afterAll(async () => {
  if (buildDir !== '') await rm(buildDir, { recursive: true, force: true });
});

describe('capsule-agent', () => {
  it('says READY and stays under 2 MiB resident when idle', async () => {
    const { child, client } = await readyAgent();
    await client.ping();
    const idleKiB = await rssKiB(child.pid);
    console.info(`capsule-agent idle VmRSS: ${idleKiB} kB`);
    expect(idleKiB).toBeGreaterThan(0);
    expect(idleKiB).toBeLessThan(2048);
    expect(client.isAlive).toBe(true);
  });

  it('streams stdout and reports exit 0', async () => {
    const { client } = await readyAgent();
    const result = await run(client, ['echo', 'hi']);
    expect(result.stdout).toBe('hi\n');
    expect(result.exit).toEqual({ exitCode: 0, signal: null, lost: false });
  });

  it('keeps stderr separate and reports the exit code', async () => {
    const { client } = await readyAgent();
    const result = await run(client, ['sh', '-c', 'echo out; echo err >&2; exit 3']);
    expect(result.stdout).toBe('out\n');
    expect(result.stderr).toBe('err\n');
    expect(result.exit).toEqual({ exitCode: 3, signal: null, lost: false });
  });

  it('reports a missing program as EXEC_FAILED', async () => {
    const { client } = await readyAgent();
    const absolute = await rejection(client.start(options(['/nope'])));
    expect(isSandboxError(absolute, 'EXEC_FAILED')).toBe(true);
    expect((absolute as Error).message).toBe('cannot start /nope: exec /nope: No such file or directory');
    expect(isSandboxError(absolute) && absolute.details).toEqual({ errno: 2, argv0: '/nope' });
    const searched = await rejection(client.start(options(['capsule-no-such-program'])));
    expect(isSandboxError(searched, 'EXEC_FAILED')).toBe(true);
    await client.ping(); // the agent survives both
  });

  it('reports a missing cwd as EXEC_FAILED', async () => {
    const { client } = await readyAgent();
    const error = await rejection(client.start(options(['true'], { cwd: '/capsule-no-such-dir' })));
    expect(isSandboxError(error, 'EXEC_FAILED')).toBe(true);
    expect((error as Error).message).toContain('chdir /capsule-no-such-dir: No such file or directory');
  });

  it('rejects invalid options before they reach the agent', async () => {
    const { client } = await readyAgent();
    expect(isSandboxError(await rejection(client.start(options([]))), 'INVALID_ARGUMENT')).toBe(true);
    expect(isSandboxError(await rejection(client.start(options(['true'], { cwd: 'tmp' }))), 'INVALID_ARGUMENT')).toBe(true);
    expect(isSandboxError(await rejection(client.start(options(['a\0b']))), 'INVALID_ARGUMENT')).toBe(true);
  });

  it('gives the child exactly the environment it was given', async () => {
    const { client } = await readyAgent();
    const result = await run(client, ['/usr/bin/env'], { env: { FOO: 'bar', PATH: '/bin', EMPTY: '' } });
    expect(result.stdout.split('\n').filter(Boolean).sort()).toEqual(['EMPTY=', 'FOO=bar', 'PATH=/bin']);
  });

  it('pipes stdin through cat and closes it', async () => {
    const { client } = await readyAgent();
    const proc = await client.start(options(['cat'], { stdin: true }));
    const output = collect(proc);
    proc.write('hello ');
    proc.write(Buffer.from('world\n'));
    proc.closeStdin();
    expect(await proc.exited).toEqual({ exitCode: 0, signal: null, lost: false });
    expect(output.stdout()).toBe('hello world\n');
    expect(() => proc.write('late')).toThrow(expect.objectContaining({ code: 'PROCESS_NOT_FOUND' }) as Error);
    proc.signal('SIGKILL'); // a no-op after exit
  });

  it('delivers stdin larger than a pipe and a frame, then returns to idle RSS', async () => {
    const { child, client } = await readyAgent();
    const input = Buffer.alloc(3 * 1024 * 1024 + 17, 'x');
    const proc = await client.start(options(['wc', '-c'], { stdin: true }));
    const output = collect(proc);
    proc.write(input);
    proc.closeStdin();
    await proc.exited;
    expect(output.stdout().trim()).toBe(String(input.length));
    await client.ping();
    const afterKiB = await rssKiB(child.pid);
    console.info(`capsule-agent VmRSS after 3 MiB of input: ${afterKiB} kB`);
    expect(afterKiB).toBeLessThan(2048);
  });

  it.each(['SIGTERM', 'SIGKILL'] as const)('reports %s of a sleeping process', async (signal) => {
    const { client } = await readyAgent();
    const proc = await client.start(options(['sleep', '1000']));
    proc.signal(signal);
    expect(await proc.exited).toEqual({ exitCode: null, signal, lost: false });
  });

  it('kills a grandchild with the process', async () => {
    const { client } = await readyAgent();
    const proc = await client.start(options(['sh', '-c', 'sleep 1000 & echo $!; wait']));
    const [, pid] = await stdoutMatching(proc, /^(\d+)\n/);
    const grandchild = Number(pid);
    expect(isRunning(grandchild)).toBe(true);
    proc.signal('SIGKILL');
    expect((await proc.exited).signal).toBe('SIGKILL');
    await waitFor(() => !isRunning(grandchild));
  });

  it('kills a grandchild that moved to its own process group', async () => {
    const { client } = await readyAgent();
    const script = 'perl -e \'setpgrp(0, 0); exec "sleep", "1000"\' & echo $!; wait';
    const proc = await client.start(options(['sh', '-c', script]));
    const [, pid] = await stdoutMatching(proc, /^(\d+)\n/);
    const grandchild = Number(pid);
    // Wait for the regrouping itself, so the kill below must rely on the session scan.
    await waitFor(() => {
      const fields = /\) \S+ \d+ (\d+)/.exec(readFileSyncSafe(`/proc/${grandchild}/stat`));
      return fields?.[1] === pid;
    });
    proc.signal('SIGKILL');
    expect((await proc.exited).signal).toBe('SIGKILL');
    await waitFor(() => !isRunning(grandchild));
  });

  it('runs a process on a pty and resizes it', async () => {
    const { client } = await readyAgent();
    const ttyRun = await run(client, ['tty'], { pty: { cols: 80, rows: 24 } });
    expect(ttyRun.stdout).toMatch(/^\/dev\/pts\/\d+\r?\n$/);
    expect(ttyRun.exit.exitCode).toBe(0);

    const proc = await client.start(options(['sh', '-c', 'stty size; read line; stty size'], { pty: { cols: 80, rows: 24 } }));
    const output = collect(proc);
    // Not stdoutMatching: output that came before any listener is replayed to the first one
    // only (collect), and `stty size` may answer before this line runs.
    await waitFor(() => /24 80\r?\n/.test(output.stdout()));
    proc.resize(132, 43);
    proc.write('go\n');
    await proc.exited;
    expect(output.stdout()).toMatch(/24 80\r?\n[\s\S]*43 132\r?\n$/);
  });

  it('ends pty input with EOT on closeStdin', async () => {
    const { client } = await readyAgent();
    const proc = await client.start(options(['cat'], { pty: { cols: 80, rows: 24 } }));
    const output = collect(proc);
    proc.write('abc\n');
    await stdoutMatching(proc, /abc\r\n[\s\S]*abc\r\n/); // the echo, then cat's copy
    proc.closeStdin();
    expect(await proc.exited).toEqual({ exitCode: 0, signal: null, lost: false });
    expect(output.stdout()).toContain('abc');
  });

  it('runs 10 processes at once', async () => {
    const { client } = await readyAgent();
    const results = await Promise.all(Array.from({ length: 10 }, (_, i) => run(client, ['sh', '-c', `echo n${i}; exit ${i}`])));
    results.forEach((result, i) => {
      expect(result.stdout).toBe(`n${i}\n`);
      expect(result.exit.exitCode).toBe(i);
    });
  });

  it('delivers 5 MiB of stdout complete and in order', async () => {
    const { client } = await readyAgent();
    const count = 800_000;
    const result = await run(client, ['seq', '1', String(count)]);
    const expected = Buffer.from(Array.from({ length: count }, (_, i) => `${i + 1}\n`).join(''));
    expect(expected.length).toBeGreaterThan(5 * 1024 * 1024);
    expect(result.stdoutBytes.length).toBe(expected.length);
    expect(result.stdoutBytes.equals(expected)).toBe(true);
    expect(result.exit.exitCode).toBe(0);
  });

  it('exits and kills its children when the client closes', async () => {
    const agent = await readyAgent();
    const proc = await agent.client.start(options(['sleep', '1000']));
    const lost = new Promise<void>((resolve) => agent.client.onLost(() => resolve()));
    agent.client.close();
    expect(await agent.exited).toEqual({ code: 0, signal: null });
    expect(await proc.exited).toEqual({ exitCode: null, signal: 'SIGKILL', lost: false });
    await lost;
    expect(agent.client.isAlive).toBe(false);
    await waitFor(() => !isRunning(proc.pid));
    expect(isSandboxError(await rejection(agent.client.start(options(['true']))))).toBe(true);
  });

  it('reports processes as lost when the agent dies', async () => {
    const agent = await readyAgent();
    const proc = await agent.client.start(options(['sleep', '1000']));
    if (agent.child.pid !== undefined) process.kill(agent.child.pid, 'SIGKILL');
    expect(await proc.exited).toEqual({ exitCode: null, signal: null, lost: true });
    expect(isSandboxError(await rejection(agent.client.start(options(['true']))), 'SANDBOX_CRASHED')).toBe(true);
    expect(isSandboxError(await rejection(agent.client.ping()), 'SANDBOX_CRASHED')).toBe(true);
    // The orphaned sleep is not the agent's to clean up any more; end it here.
    process.kill(proc.pid, 'SIGKILL');
  });

  it('rejects ready when the agent ends before READY', async () => {
    const child = spawn('true', [], { stdio: ['pipe', 'pipe', 'pipe'] });
    const client = new AgentClient(child.stdin, child.stdout);
    expect(isSandboxError(await rejection(client.ready), 'SANDBOX_CRASHED')).toBe(true);
  });

  it('treats an oversized frame from the agent as a crash', async () => {
    const toAgent = new PassThrough();
    const fromAgent = new PassThrough();
    const client = new AgentClient(toAgent, fromAgent);
    const lost = new Promise<unknown>((resolve) => client.onLost(resolve));
    fromAgent.write(encodeFrame(FrameType.Ready, 0));
    await client.ready;
    const header = Buffer.alloc(HEADER_BYTES);
    header.writeUInt8(FrameType.Stdout, 0);
    header.writeUInt32BE(2 * 1024 * 1024, 5);
    fromAgent.write(header);
    expect(isSandboxError(await lost, 'SANDBOX_CRASHED')).toBe(true);
    expect(client.isAlive).toBe(false);
    expect(toAgent.writableEnded).toBe(true);
  });

  it.each([
    ['an oversized frame', Buffer.from([FrameType.Input, 0, 0, 0, 1, 0, 0x20, 0, 0])],
    ['an unknown frame type', Buffer.from([0x7a, 0, 0, 0, 1, 0, 0, 0, 0])],
  ])('exits 70 on %s', async (_name, frame) => {
    const child = spawn(agentPath, [], { stdio: ['pipe', 'pipe', 'pipe'] });
    // 'close' rather than 'exit': it waits for stderr to be read to the end.
    const exited = new Promise<number | null>((resolve) => child.on('close', (code) => resolve(code)));
    let stderr = '';
    child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    child.stdout.resume();
    expect(frame.length).toBe(HEADER_BYTES);
    child.stdin.write(encodeFrame(FrameType.Ping, 1));
    child.stdin.write(frame);
    expect(await exited).toBe(70);
    expect(stderr).toMatch(/exceeds 1 MiB|unknown frame type/);
  });
});

function readFileSyncSafe(path: string): string {
  try {
    return readFileSync(path, 'utf8');
  } catch {
    return '';
  }
}
