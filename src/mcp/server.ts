import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import { toJsonSchemaCompat } from '@modelcontextprotocol/sdk/server/zod-json-schema-compat.js';
import { CallToolRequestSchema, ListToolsRequestSchema, type Tool } from '@modelcontextprotocol/sdk/types.js';
import { AjvJsonSchemaValidator } from '@modelcontextprotocol/sdk/validation/ajv';
import type { ConnectionOptions } from '../sdk/index.js';
import { failureText, SandboxHandles, schemaOf, TOOLS, type ToolDefinition } from '../agent-tools/index.js';
import { callTool, type ToolAnswer } from './tools.js';

/** The MCP server's name and version, as clients see them. */
export const MCP_SERVER_INFO = { name: 'capsule', version: '0.1.0' } as const;

const INSTRUCTIONS =
  'Capsule runs code in isolated Linux sandboxes. Call create_sandbox first and keep its sandboxId; ' +
  'then exec, run_code, write_file, read_file, list_files; start_command and wait_command for long jobs; ' +
  'snapshot_sandbox, fork_sandbox and sandbox_changes to branch work and see what changed; ' +
  'port_url to reach a server inside; kill_sandbox (confirm: true) when done.';

const BY_NAME = new Map<string, ToolDefinition>(TOOLS.map((tool) => [tool.name, tool]));

/** The catalog as `tools/list` answers it (JSON Schema as the SDK's McpServer writes it), made once: the tools never change. */
let listed: Tool[] | undefined;

function toolList(): Tool[] {
  return (listed ??= TOOLS.map((tool) => ({
    name: tool.name,
    title: tool.title,
    description: tool.description,
    inputSchema: toJsonSchemaCompat(schemaOf(tool), { strictUnions: true, pipeStrategy: 'input' }) as Tool['inputSchema'],
    annotations: { readOnlyHint: !tool.mutates, destructiveHint: tool.destructive === true, openWorldHint: false },
    // No tool runs as an MCP task (each answers when it is done, or starts a session: start_command).
    execution: { taskSupport: 'forbidden' as const },
  })));
}

/** What a call of a tool the catalog does not have answers: an error result, as for any failed call. */
function unknownTool(name: string): ToolAnswer {
  const failure = { code: 'NOT_FOUND' as const, message: `there is no tool named ${name}`, hint: `Call one of: ${TOOLS.map((tool) => tool.name).join(', ')} (tools/list describes them).` };
  return { content: [{ type: 'text', text: failureText(failure) }], structuredContent: { ...failure }, isError: true };
}

/**
 * An MCP server whose tools call Capsule's API with `connection` (a URL and an API key, and in
 * `capsule serve` the in-process transport): every call goes through the API's one seam, so it
 * is authenticated, tenant-scoped and audited there like any SDK call. The same server runs over
 * stdio (`capsule mcp`) and over HTTP (`/mcp`, one per request).
 *
 * The SDK's low-level `Server` with the two tool methods, not its `McpServer`: the catalog checks
 * each call's arguments itself (`runTool`, as for every framework adapter) and its list is made
 * once, where `McpServer` registers every tool again for each request and checks the arguments
 * twice (~0.1 ms of a tool call over HTTP).
 */
export function createMcpServer(connection: ConnectionOptions, handles = new SandboxHandles(), validator = new AjvJsonSchemaValidator()): Server {
  // The validator is made once by a caller that makes a server per request (/mcp): an Ajv instance costs ~1 ms.
  const server = new Server(MCP_SERVER_INFO, { capabilities: { tools: {} }, instructions: INSTRUCTIONS, jsonSchemaValidator: validator });
  server.setRequestHandler(ListToolsRequestSchema, () => ({ tools: toolList() }));
  server.setRequestHandler(CallToolRequestSchema, (request) => {
    const tool = BY_NAME.get(request.params.name);
    return tool ? callTool(tool, request.params.arguments ?? {}, connection, handles) : unknownTool(request.params.name);
  });
  return server;
}
