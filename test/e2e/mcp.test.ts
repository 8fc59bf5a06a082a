/**
 * The MCP server with the official MCP client over both transports: streamable HTTP at /mcp on a
 * real server (two tenants), and stdio (`capsule mcp`, the built CLI, as a child process). Real
 * sandboxes; the flow an agent runs: create, write a script, run it, read its output, kill.
 */
import { join } from 'node:path';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import type { Transport } from '@modelcontextprotocol/sdk/shared/transport.js';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { registerMcpHttp } from '../../src/mcp/http.js';
import { expectNoLeaks } from '../helpers/sandbox.js';
import { startTestServer, type TestServer } from './server-helpers.js';

const BIN = join(import.meta.dirname, '..', '..', 'bin', 'capsule.js');
let t: TestServer;
let otherKey = '';
const clients: Client[] = [];

beforeAll(async () => {
  t = await startTestServer({ extensions: [registerMcpHttp] });
  const minted = await t.json<{ apiKey: string }>('POST', '/v1/keys', { body: { tenantId: 'mcp-other' } });
  otherKey = minted.body.apiKey;
});

afterAll(async () => {
  await t?.server.close();
});

afterEach(async () => {
  await Promise.all(clients.splice(0).map((client) => client.close()));
  await expectNoLeaks();
});

function httpTransport(key: string | undefined): Transport {
  return new StreamableHTTPClientTransport(new URL(`${t.url}/mcp`), {
    requestInit: { headers: key === undefined ? {} : { authorization: `Bearer ${key}` } },
  });
}

function stdioTransport(): Transport {
  return new StdioClientTransport({
    command: process.execPath,
    args: [BIN, 'mcp'],
    env: { PATH: process.env.PATH ?? '/usr/bin:/bin', CAPSULE_URL: t.url, CAPSULE_API_KEY: t.apiKey },
    stderr: 'pipe',
  });
}

async function connect(transport: Transport): Promise<Client> {
  const client = new Client({ name: 'capsule-test', version: '1.0.0' });
  await client.connect(transport);
  clients.push(client);
  return client;
}

interface ToolOutcome {
  isError: boolean;
  data: Record<string, unknown>;
  text: string;
}

async function call(client: Client, name: string, args: Record<string, unknown>): Promise<ToolOutcome> {
  const result = await client.callTool({ name, arguments: args });
  const content = result.content as { type: string; text: string }[];
  return { isError: result.isError === true, data: (result.structuredContent ?? {}) as Record<string, unknown>, text: content.map((c) => c.text).join('\n') };
}

/** Create, write a script, run it, read what it wrote, kill (with the explicit flag). */
async function agentFlow(client: Client): Promise<string> {
  const created = await call(client, 'create_sandbox', { limits: { wallClockMs: 30_000 } });
  expect(created.isError, created.text).toBe(false);
  const sandboxId = String(created.data.sandboxId);
  expect(sandboxId).toMatch(/^[a-z2-7]{20}$/);
  try {
    await agentSteps(client, sandboxId);
  } finally {
    // Whatever failed above, the sandbox does not outlive the test.
    await call(client, 'kill_sandbox', { sandboxId, confirm: true });
  }
  return sandboxId;
}

async function agentSteps(client: Client, sandboxId: string): Promise<void> {
  expect((await call(client, 'write_file', { sandboxId, path: 'job.py', content: 'open("out.txt", "w").write(str(6 * 7))\nprint("done")\n' })).isError).toBe(false);
  const ran = await call(client, 'exec', { sandboxId, command: 'python3 job.py' });
  expect(ran.data).toMatchObject({ outcome: 'ok', exitCode: 0, stdout: 'done\n', stdoutTruncated: false });
  expect((await call(client, 'read_file', { sandboxId, path: 'out.txt' })).data).toMatchObject({ content: '42', truncated: false });
  const code = await call(client, 'run_code', { sandboxId, code: 'x = 20\nx + 22' });
  expect(code.data.results).toEqual([{ text: '42' }]);
  const listed = await call(client, 'list_sandboxes', {});
  expect((listed.data.sandboxes as { sandboxId: string }[]).map((s) => s.sandboxId)).toContain(sandboxId);

  // Killing needs the explicit flag: without it, an error result, and the sandbox still runs.
  const refused = await client.callTool({ name: 'kill_sandbox', arguments: { sandboxId } });
  expect(refused.isError).toBe(true);
  expect((await call(client, 'exec', { sandboxId, command: 'true' })).data.exitCode).toBe(0);
  expect((await call(client, 'kill_sandbox', { sandboxId, confirm: true })).data).toMatchObject({ sandboxId, state: 'killed' });
}

describe('MCP over streamable HTTP at /mcp', () => {
  it('lists the tools with input schemas', async () => {
    const client = await connect(httpTransport(t.apiKey));
    const { tools } = await client.listTools();
    const names = tools.map((tool) => tool.name);
    for (const name of ['create_sandbox', 'exec', 'start_command', 'wait_command', 'send_stdin', 'signal_command', 'run_code', 'write_file', 'read_file', 'list_files', 'port_url', 'kill_sandbox', 'list_sandboxes']) {
      expect(names).toContain(name);
    }
    const exec = tools.find((tool) => tool.name === 'exec');
    expect(exec?.inputSchema.required).toEqual(expect.arrayContaining(['sandboxId', 'command']));
    expect(tools.find((tool) => tool.name === 'kill_sandbox')?.annotations?.destructiveHint).toBe(true);
  });

  it('runs an agent task; each tool call is audited under the caller key', async () => {
    const client = await connect(httpTransport(t.apiKey));
    const sandboxId = await agentFlow(client);
    const operations = t.server.app.services.audit.list({ limit: 1000 }).filter((record) => record.sandboxId === sandboxId).map((record) => record.operation);
    expect(operations).toEqual(expect.arrayContaining(['sandboxes.create', 'files.write', 'processes.start', 'sandboxes.kill']));
  }, 120_000);

  it('keeps tenants apart: another key sees an error result with the code and hint, not the sandbox', async () => {
    const owner = await connect(httpTransport(t.apiKey));
    const created = await call(owner, 'create_sandbox', {});
    const sandboxId = String(created.data.sandboxId);
    try {
      const intruder = await connect(httpTransport(otherKey));
      const denied = await call(intruder, 'exec', { sandboxId, command: 'cat /etc/hostname' });
      expect(denied.isError).toBe(true);
      expect(denied.data).toMatchObject({ code: 'SANDBOX_NOT_FOUND', hint: expect.any(String) as unknown });
      expect(denied.text).toMatch(/^SANDBOX_NOT_FOUND: .*\nHint: /);
      expect(((await call(intruder, 'list_sandboxes', {})).data.sandboxes as unknown[]).length).toBe(0);
    } finally {
      await call(owner, 'kill_sandbox', { sandboxId, confirm: true });
    }
  }, 60_000);

  it('refuses a client without a key', async () => {
    await expect(connect(httpTransport(undefined))).rejects.toThrow(/401|UNAUTHENTICATED/);
    await expect(connect(httpTransport('cap_0000000000000000000000000000000000000000'))).rejects.toThrow(/401|UNAUTHENTICATED/);
  });
});

describe('MCP over stdio (capsule mcp)', () => {
  it('runs the same agent task through the CLI', async () => {
    const client = await connect(stdioTransport());
    expect(client.getServerVersion()?.name).toBe('capsule');
    await agentFlow(client);
  }, 120_000);
});
