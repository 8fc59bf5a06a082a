import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { AjvJsonSchemaValidator } from '@modelcontextprotocol/sdk/validation/ajv';
import type { ConnectionOptions } from '../sdk/index.js';
import { SandboxHandles, schemaOf, TOOLS } from '../agent-tools/index.js';
import { callTool } from './tools.js';

/** The MCP server's name and version, as clients see them. */
export const MCP_SERVER_INFO = { name: 'capsule', version: '0.1.0' } as const;

/**
 * An MCP server whose tools call Capsule's API with `connection` (a URL and an API key): every
 * call goes through the API's one seam, so it is authenticated, tenant-scoped and audited there
 * like any SDK call. The same server runs over stdio (`capsule mcp`) and over HTTP (`/mcp`).
 */
export function createMcpServer(connection: ConnectionOptions, handles = new SandboxHandles(), validator = new AjvJsonSchemaValidator()): McpServer {
  const server = new McpServer(MCP_SERVER_INFO, {
    // Made once by a caller that makes a server per request (/mcp): an Ajv instance costs ~1 ms.
    jsonSchemaValidator: validator,
    instructions:
      'Capsule runs code in isolated Linux sandboxes. Call create_sandbox first and keep its sandboxId; ' +
      'then exec, run_code, write_file, read_file, list_files; start_command and wait_command for long jobs; ' +
      'snapshot_sandbox, fork_sandbox and sandbox_changes to branch work and see what changed; ' +
      'port_url to reach a server inside; kill_sandbox (confirm: true) when done.',
  });
  for (const tool of TOOLS) {
    server.registerTool(
      tool.name,
      {
        title: tool.title,
        description: tool.description,
        inputSchema: schemaOf(tool),
        annotations: { readOnlyHint: !tool.mutates, destructiveHint: tool.destructive === true, openWorldHint: false },
      },
      (args: Record<string, unknown>) => callTool(tool, args, connection, handles),
    );
  }
  return server;
}
