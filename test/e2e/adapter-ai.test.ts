/**
 * `capsule/ai` with the real Vercel AI SDK (`ai`): each tool's input is checked with the SDK's own
 * schema handling (`asSchema(...).validate`, what generateText does before it calls a tool), then
 * run through the tool's `execute`, against a real server and real sandboxes. No model.
 */
import { asSchema, type Tool } from 'ai';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { capsuleTools } from '../../src/agent-tools/ai.js';
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

function caller(tools: Record<string, Tool<Record<string, unknown>, Record<string, unknown>>>): ToolCall {
  let calls = 0;
  return async (name, args) => {
    const found = tools[name];
    if (!found?.execute) throw new Error(`no tool ${name}`);
    const checked = await asSchema(found.inputSchema).validate?.(args);
    if (checked !== undefined && !checked.success) return { ok: false, text: checked.error.message };
    try {
      const data = await found.execute(checked?.value ?? args, { toolCallId: `call-${++calls}`, messages: [] });
      return { ok: true, data: data as Record<string, unknown> };
    } catch (error) {
      return { ok: false, text: (error as Error).message };
    }
  };
}

describe('capsule/ai', () => {
  it('offers a tool set keyed by name, with JSON schemas the SDK sends to models', async () => {
    const tools = capsuleTools({ url: t.url, apiKey: t.apiKey });
    expect(Object.keys(tools)).toEqual(expect.arrayContaining(['create_sandbox', 'exec', 'run_code', 'write_file', 'read_file', 'list_files', 'snapshot_sandbox', 'fork_sandbox', 'sandbox_changes', 'kill_sandbox']));
    const schema = (await asSchema(tools.exec!.inputSchema).jsonSchema) as { required?: string[]; properties?: Record<string, unknown> };
    expect(schema.required).toEqual(expect.arrayContaining(['sandboxId', 'command']));
    expect(Object.keys(schema.properties ?? {})).toContain('timeoutMs');
  });

  it('runs the agent flow: create, write a script, run it, read the output, fork, kill', async () => {
    await agentFlow(caller(capsuleTools({ url: t.url, apiKey: t.apiKey })));
  }, 180_000);

  it('refuses a kill without the flag even when execute is called directly', async () => {
    const tools = capsuleTools({ url: t.url, apiKey: t.apiKey, tools: ['kill_sandbox'] });
    await expect(tools.kill_sandbox!.execute!({ sandboxId: 'aaaaaaaaaaaaaaaaaaaa' }, { toolCallId: 'x', messages: [] })).rejects.toThrow(/^INVALID_ARGUMENT: invalid arguments for kill_sandbox: confirm: .*\nHint: .*confirm: true/);
  });
});
