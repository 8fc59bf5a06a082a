/**
 * `capsule/langchain` with the real @langchain/core: the tools are driven through LangChain's own
 * `invoke` (its schema check, then our call), against a real server and real sandboxes. No model.
 */
import type { DynamicStructuredTool } from '@langchain/core/tools';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { capsuleTools } from '../../src/agent-tools/langchain.js';
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

function caller(tools: DynamicStructuredTool[]): ToolCall {
  return async (name, args) => {
    const found = tools.find((candidate) => candidate.name === name);
    if (!found) throw new Error(`no tool ${name}`);
    try {
      return { ok: true, data: JSON.parse(String(await found.invoke(args))) as Record<string, unknown> };
    } catch (error) {
      return { ok: false, text: (error as Error).message };
    }
  };
}

describe('capsule/langchain', () => {
  it('offers the tools as LangChain structured tools with their schemas', () => {
    const tools = capsuleTools({ url: t.url, apiKey: t.apiKey });
    expect(tools.map((candidate) => candidate.name)).toEqual(expect.arrayContaining(['create_sandbox', 'exec', 'run_code', 'write_file', 'read_file', 'list_files', 'snapshot_sandbox', 'fork_sandbox', 'sandbox_changes', 'kill_sandbox']));
    expect(capsuleTools({ url: t.url, apiKey: t.apiKey, tools: ['exec'] }).map((candidate) => candidate.name)).toEqual(['exec']);
    expect(() => capsuleTools({ tools: ['rm_rf'] })).toThrow(/unknown Capsule tools: rm_rf/);
  });

  it('runs the agent flow: create, write a script, run it, read the output, fork, kill', async () => {
    const { sandboxId } = await agentFlow(caller(capsuleTools({ url: t.url, apiKey: t.apiKey })));
    const operations = t.server.app.services.audit.list({ limit: 1000 }).filter((record) => record.sandboxId === sandboxId).map((record) => record.operation);
    expect(operations).toEqual(expect.arrayContaining(['sandboxes.create', 'files.write', 'processes.start', 'sandboxes.fork', 'sandboxes.kill']));
  }, 180_000);
});
