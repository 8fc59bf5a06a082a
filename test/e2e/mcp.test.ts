/**
 * The MCP server with the official MCP client over both transports: streamable HTTP at /mcp on a
 * real server (two tenants), and stdio (`capsule mcp`, the built CLI, as a child process). Real
 * sandboxes; the flow an agent runs (test/e2e/agent-flow.ts): create, write a script, run it, read
 * its output, fork, see the fork's changes, kill.
 */
import { request as httpRequest } from 'node:http';
import { join } from 'node:path';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import type { Transport } from '@modelcontextprotocol/sdk/shared/transport.js';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { registerMcpHttp } from '../../src/mcp/http.js';
import { expectNoLeaks } from '../helpers/sandbox.js';
import { agentFlow, type ToolCall } from './agent-flow.js';
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

/** A JSON POST with headers fetch cannot send (Host), over node:http to the test server. */
function rawPost(path: string, body: unknown, headers: Record<string, string>): Promise<unknown> {
  return new Promise((resolve, reject) => {
    const text = JSON.stringify(body);
    const request = httpRequest(`${t.url}${path}`, { method: 'POST', headers: { ...headers, 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(text)) } }, (response) => {
      const chunks: Buffer[] = [];
      response.on('data', (chunk: Buffer) => chunks.push(chunk));
      response.on('end', () => {
        try {
          resolve(JSON.parse(Buffer.concat(chunks).toString()) as unknown);
        } catch (error) {
          reject(error instanceof Error ? error : new Error(String(error)));
        }
      });
    });
    request.once('error', reject);
    request.end(text);
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

/** The MCP client as the shared flow's tool call: an error result is the text the model reads. */
function caller(client: Client): ToolCall {
  return async (name, args) => {
    const outcome = await call(client, name, args);
    return outcome.isError ? { ok: false, text: outcome.text } : { ok: true, data: outcome.data };
  };
}

describe('MCP over streamable HTTP at /mcp', () => {
  it('lists the tools with input schemas', async () => {
    const client = await connect(httpTransport(t.apiKey));
    const { tools } = await client.listTools();
    const names = tools.map((tool) => tool.name);
    for (const name of [
      'create_sandbox', 'exec', 'start_command', 'wait_command', 'send_stdin', 'signal_command', 'run_code', 'write_file', 'read_file', 'list_files',
      'port_url', 'snapshot_sandbox', 'fork_sandbox', 'sandbox_changes', 'delete_snapshot', 'kill_sandbox', 'list_sandboxes',
    ]) {
      expect(names).toContain(name);
    }
    const exec = tools.find((tool) => tool.name === 'exec');
    expect(exec?.inputSchema.required).toEqual(expect.arrayContaining(['sandboxId', 'command']));
    const create = tools.find((tool) => tool.name === 'create_sandbox');
    expect(Object.keys(create?.inputSchema.properties ?? {})).toEqual(expect.arrayContaining(['template', 'snapshot', 'limits', 'network']));
    // Killing and deleting are marked destructive and take the explicit flag; nothing else is.
    const destructive = tools.filter((tool) => tool.annotations?.destructiveHint === true).map((tool) => tool.name);
    expect(destructive.sort()).toEqual(['delete_snapshot', 'kill_sandbox']);
    for (const name of destructive) expect(tools.find((tool) => tool.name === name)?.inputSchema.required).toContain('confirm');
  });

  it('runs an agent task; each tool call is audited under the caller key', async () => {
    const client = await connect(httpTransport(t.apiKey));
    const { sandboxId } = await agentFlow(caller(client));
    const operations = t.server.app.services.audit.list({ limit: 1000 }).filter((record) => record.sandboxId === sandboxId).map((record) => record.operation);
    expect(operations).toEqual(expect.arrayContaining(['sandboxes.create', 'files.write', 'processes.start', 'sandboxes.fork', 'sandboxes.kill']));
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

  it("snapshot_sandbox keeps the sandbox's volumes only when asked, and says which it kept", async () => {
    const client = await connect(httpTransport(t.apiKey));
    expect((await t.json('POST', '/v1/volumes', { body: { name: 'mcp-vol', sizeBytes: 16 * 1024 * 1024 } })).status).toBe(201);
    const created = await t.json<{ sandboxId: string }>('POST', '/v1/sandboxes', { body: { spec: { volumes: [{ name: 'mcp-vol', path: '/data' }] } } });
    const { sandboxId } = created.body;
    const snapshots: string[] = [];
    try {
      const plain = await call(client, 'snapshot_sandbox', { sandboxId });
      const kept = await call(client, 'snapshot_sandbox', { sandboxId, includeVolumes: true });
      snapshots.push(String(plain.data.snapshotId), String(kept.data.snapshotId));
      expect(plain.data.volumes).toEqual([{ name: 'mcp-vol', path: '/data', included: false }]);
      expect(kept.data.volumes).toEqual([{ name: 'mcp-vol', path: '/data', included: true }]);
    } finally {
      await call(client, 'kill_sandbox', { sandboxId, confirm: true });
      for (const id of snapshots) await t.call('DELETE', `/v1/snapshots/${id}`);
      await t.call('DELETE', '/v1/volumes/mcp-vol');
    }
  }, 60_000);

  it('answers HTTP as a stateless endpoint: 405 for GET and DELETE, the protocol errors with their status', async () => {
    const accept = { accept: 'application/json, text/event-stream' };
    for (const method of ['GET', 'DELETE']) {
      const answer = await t.json<{ error: { message: string } }>(method, '/mcp', { headers: { accept: 'text/event-stream' } });
      expect(answer.status).toBe(405);
      expect(answer.headers.get('allow')).toBe('POST');
      expect(answer.body.error.message).toMatch(/stateless.*POST/);
    }
    // A notification alone is accepted with no body; a request without the Accept the transport
    // requires, or a body that is no JSON-RPC message, gets the SDK's status and error.
    const notification = await t.call('POST', '/mcp', { body: { jsonrpc: '2.0', method: 'notifications/initialized' }, headers: accept });
    expect(notification.status).toBe(202);
    expect(await notification.text()).toBe('');
    const ping = { jsonrpc: '2.0', id: 7, method: 'ping' };
    expect((await t.json('POST', '/mcp', { body: ping, headers: { accept: 'application/json' } })).status).toBe(406);
    const notRpc = await t.json<{ error: { code: number } }>('POST', '/mcp', { body: { hello: 'world' }, headers: accept });
    expect(notRpc.status).toBe(400);
    expect(notRpc.body.error.code).toBe(-32700);
    const batch = await t.json<{ id: number; result: unknown }[]>('POST', '/mcp', { body: [ping, { ...ping, id: 8 }], headers: accept });
    expect(batch.status).toBe(200);
    expect(batch.headers.get('content-type')).toMatch(/^application\/json/);
    expect(batch.body.map((answer) => answer.id).sort()).toEqual([7, 8]);
  });

  it('hands back port URLs on the origin the MCP client reached (its Host), not the server\'s loopback', async () => {
    const client = await connect(httpTransport(t.apiKey));
    const sandboxId = String((await call(client, 'create_sandbox', {})).data.sandboxId);
    try {
      // The connection goes to loopback; only the Host names another origin, as for a client
      // behind a proxy or on another machine (fetch cannot set Host, so this is one raw POST).
      const answer = await rawPost('/mcp', { jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'port_url', arguments: { sandboxId, port: 8080 } } }, {
        authorization: `Bearer ${t.apiKey}`,
        host: 'capsule.test:7443',
        accept: 'application/json, text/event-stream',
        'mcp-protocol-version': '2025-06-18',
      });
      const url = (answer as { result: { structuredContent: { url: string } } }).result.structuredContent.url;
      expect(url).toMatch(new RegExp(`^http://capsule\\.test:7443/v1/sandboxes/${sandboxId}/ports/8080/\\?`));
    } finally {
      await call(client, 'kill_sandbox', { sandboxId, confirm: true });
    }
  }, 60_000);

  it('answers a call of an unknown tool or with bad arguments as an error result with the code and hint', async () => {
    const client = await connect(httpTransport(t.apiKey));
    const unknown = await call(client, 'no_such_tool', {});
    expect(unknown.isError).toBe(true);
    expect(unknown.data).toMatchObject({ code: 'NOT_FOUND', hint: expect.stringContaining('exec') as unknown });
    const bad = await call(client, 'exec', { sandboxId: 'x' });
    expect(bad.isError).toBe(true);
    expect(bad.data).toMatchObject({ code: 'INVALID_ARGUMENT', message: expect.stringContaining('command') as unknown });
    // Unknown arguments are refused too (the catalog's schemas are strict).
    expect((await call(client, 'list_sandboxes', { everything: true })).data).toMatchObject({ code: 'INVALID_ARGUMENT' });
  });

  it('refuses a client without a key', async () => {
    await expect(connect(httpTransport(undefined))).rejects.toThrow(/401|UNAUTHENTICATED/);
    await expect(connect(httpTransport('cap_0000000000000000000000000000000000000000'))).rejects.toThrow(/401|UNAUTHENTICATED/);
  });
});

describe('MCP over stdio (capsule mcp)', () => {
  it('runs the same agent task through the CLI', async () => {
    const client = await connect(stdioTransport());
    expect(client.getServerVersion()?.name).toBe('capsule');
    await agentFlow(caller(client));
  }, 120_000);
});
