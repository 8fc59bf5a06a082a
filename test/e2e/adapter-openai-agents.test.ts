/**
 * `capsule/openai-agents` with the real @openai/agents, against a real server and real sandboxes,
 * no model: the function tools through the SDK's own `invoke` (JSON arguments as a model sends
 * them), and `CapsuleSandboxClient` with the SDK's own shell and filesystem capabilities bound to
 * its session (exec_command, write_stdin, apply_patch), the way a SandboxAgent uses them.
 */
import { RunContext, type FunctionTool } from '@openai/agents';
import { Manifest, file, filesystem, shell } from '@openai/agents/sandbox';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { CapsuleSandboxClient, capsuleTools, type CapsuleSandboxSession } from '../../src/agent-tools/openai-agents.js';
import { Sandbox, Snapshots } from '../../src/sdk/index.js';
import { expectNoLeaks } from '../helpers/sandbox.js';
import { agentFlow, type ToolCall } from './agent-flow.js';
import { startTestServer, type TestServer } from './server-helpers.js';

let t: TestServer;

beforeAll(async () => {
  t = await startTestServer();
});

afterAll(async () => {
  await t?.server.close();
});

afterEach(expectNoLeaks);

/** The SDK's invoke answers a failed tool with its error function's text, for the model. */
function caller(tools: FunctionTool[]): ToolCall {
  return async (name, args) => {
    const found = tools.find((candidate) => candidate.name === name);
    if (!found) throw new Error(`no tool ${name}`);
    const answer = await found.invoke(new RunContext(), JSON.stringify(args));
    const text = typeof answer === 'string' ? answer : JSON.stringify(answer);
    try {
      return { ok: true, data: JSON.parse(text) as Record<string, unknown> };
    } catch {
      return { ok: false, text };
    }
  };
}

type InvokableTool = { name: string; invoke: (context: RunContext, input: string) => Promise<unknown> };

function toolNamed(tools: unknown[], name: string): InvokableTool {
  const found = (tools as InvokableTool[]).find((candidate) => candidate.name === name);
  if (!found) throw new Error(`the capability has no tool ${name}`);
  return found;
}

describe('capsule/openai-agents function tools', () => {
  it('runs the agent flow: create, write a script, run it, read the output, fork, kill', async () => {
    await agentFlow(caller(capsuleTools({ url: t.url, apiKey: t.apiKey })));
  }, 180_000);
});

describe('CapsuleSandboxClient, the Agents SDK sandbox client', () => {
  it('runs the flow through the SDK\'s shell and filesystem capabilities, forks, and cleans up', async () => {
    const client = new CapsuleSandboxClient({ url: t.url, apiKey: t.apiKey, spec: { template: 'host', limits: { wallClockMs: 60_000 } } });
    const manifest = new Manifest({ entries: { 'job.py': file({ content: 'open("out.txt", "w").write(str(6 * 7))\nprint("done")\n' }) }, environment: { GREETING: 'hello' } });
    const session = await client.create({ manifest });
    const sessions: CapsuleSandboxSession[] = [session];
    const snapshots: string[] = [];
    try {
      expect(await session.running()).toBe(true);
      const context = new RunContext();
      const shellTools = shell().bind(session).tools();
      const exec = toolNamed(shellTools, 'exec_command');

      // The manifest's script is there; run it, then read what it wrote.
      const ran = String(await exec.invoke(context, JSON.stringify({ cmd: 'python3 job.py && echo "$GREETING"' })));
      expect(ran).toMatch(/Process exited with code 0\nOutput:\ndone\nhello\n$/);
      expect(new TextDecoder().decode(await session.readFile({ path: 'out.txt' }))).toBe('42');

      // apply_patch writes through the session's editor.
      const patch = toolNamed(filesystem().bind(session).tools(), 'apply_patch');
      expect(String(await patch.invoke(context, '*** Begin Patch\n*** Add File: notes/plan.md\n+step one\n*** End Patch\n'))).toContain('Created /workspace/notes/plan.md');
      expect((await session.listDir({ path: 'notes' })).map((entry) => entry.name)).toEqual(['plan.md']);

      // A long command yields a session id; write_stdin feeds it and sees it end.
      const started = String(await exec.invoke(context, JSON.stringify({ cmd: 'read line; echo "got $line"', yield_time_ms: 200 })));
      const sessionId = Number(/Process running with session ID (\d+)/.exec(started)?.[1]);
      expect(sessionId).toBeGreaterThan(0);
      const stdin = toolNamed(shellTools, 'write_stdin');
      const fed = String(await stdin.invoke(context, JSON.stringify({ session_id: sessionId, chars: 'ping\n', yield_time_ms: 30_000 })));
      expect(fed).toMatch(/Process exited with code 0\nOutput:\ngot ping\n$/);
      expect(String(await exec.invoke(context, JSON.stringify({ cmd: 'true', tty: true })))).toMatch(/do not support a TTY/);

      // Fork: the new session has the files; its changes are its own.
      const forked = await session.fork(1);
      snapshots.push(forked.snapshotId);
      expect(forked.errors).toEqual([]);
      const fork = forked.sessions[0]!;
      sessions.push(fork);
      const forkExec = toolNamed(shell().bind(fork).tools(), 'exec_command');
      expect(String(await forkExec.invoke(context, JSON.stringify({ cmd: 'cat out.txt; echo changed > out.txt' })))).toMatch(/Output:\n42$/);
      expect((await fork.changes()).changes.map((change) => `${change.kind} ${change.path}`)).toEqual(['modified /workspace/out.txt']);
      expect(new TextDecoder().decode(await session.readFile({ path: 'out.txt' }))).toBe('42');

      // A RunState keeps only the sandbox id; resume reaches the same sandbox.
      const saved = await client.serializeSessionState(fork.state);
      expect(saved).toEqual({ sandboxId: fork.sandboxId });
      const resumed = await client.resume(await client.deserializeSessionState({ ...saved, manifest: {} }));
      expect(new TextDecoder().decode(await resumed.readFile({ path: 'out.txt' }))).toBe('changed\n');

      // The SDK cleans up an owned session with delete(): the sandbox is killed.
      await client.delete(fork.state);
      await session.delete();
      expect((await Sandbox.connect(session.sandboxId, { url: t.url, apiKey: t.apiKey })).info.state).toBe('killed');
    } finally {
      for (const each of sessions) await each.delete().catch(() => undefined);
      for (const snapshotId of snapshots) await Snapshots.delete(snapshotId, { url: t.url, apiKey: t.apiKey }).catch(() => undefined);
    }
  }, 180_000);

  it('starts from a Capsule snapshot, and refuses what it cannot honour by name', async () => {
    const client = new CapsuleSandboxClient({ url: t.url, apiKey: t.apiKey, spec: { template: 'host' } });
    const first = await client.create(new Manifest({ entries: { 'data.txt': file({ content: 'kept' }) } }));
    let snapshotId = '';
    try {
      snapshotId = (await first.snapshot({ name: 'base' })).snapshotId;
      const second = await client.create({ snapshot: { type: 'capsule', snapshotId } });
      try {
        expect(new TextDecoder().decode(await second.readFile({ path: 'data.txt' }))).toBe('kept');
      } finally {
        await second.delete();
      }
      await expect(client.create({ snapshot: { type: 'local' } })).rejects.toThrow(/Capsule snapshots only/);
      await expect(client.create(new Manifest({ entries: { src: { type: 'local_dir', src: '/etc' } } }))).rejects.toThrow(/entries of type local_dir/);
    } finally {
      await first.delete();
      if (snapshotId !== '') await Snapshots.delete(snapshotId, { url: t.url, apiKey: t.apiKey });
    }
  }, 120_000);
});
