import { Command } from 'commander';
import type { CliContext } from '../context.js';

interface McpFlags {
  url?: string;
  apiKey?: string;
  dataDir?: string;
}

/**
 * `capsule mcp`: an MCP server on stdio for agents (Claude Desktop, Cursor, any MCP client). With
 * CAPSULE_URL (or --url) it drives that server with CAPSULE_API_KEY; with none it starts a local
 * server in this process, on loopback, for as long as the client stays connected.
 */
export function mcpCommand(context: CliContext): Command {
  return new Command('mcp')
    .description('Serve Capsule to an MCP client over stdio (a local server unless CAPSULE_URL names one)')
    .option('--url <url>', 'Capsule server (default $CAPSULE_URL; none starts a local server)')
    .option('--api-key <key>', 'API key (default $CAPSULE_API_KEY)')
    .option('--data-dir <dir>', 'data directory of the local server')
    .action(async (flags: McpFlags) => {
      const [{ createMcpServer }, { StdioServerTransport }] = await Promise.all([import('../../mcp/server.js'), import('@modelcontextprotocol/sdk/server/stdio.js')]);
      let url = flags.url ?? context.env.CAPSULE_URL;
      let apiKey = flags.apiKey ?? context.env.CAPSULE_API_KEY;
      let local: { close(): Promise<void> } | undefined;
      if (url === undefined) {
        const [{ startServer }, { newApiKey }, { DEFAULT_DATA_DIR }] = await Promise.all([
          import('../../server/bootstrap.js'),
          import('../../store/index.js'),
          import('../../host/host-env.host.js'),
        ]);
        apiKey ??= newApiKey();
        const started = await startServer({
          dataDir: flags.dataDir ?? DEFAULT_DATA_DIR,
          port: 0,
          host: '127.0.0.1',
          env: { ...context.env, CAPSULE_API_KEY: apiKey },
          // stdout is the MCP channel: logs go to stderr.
          logger: { level: 'warn', stream: context.stderr },
        });
        local = started;
        url = started.url;
      }
      const server = createMcpServer({ url, ...(apiKey !== undefined && { apiKey }) });
      const closed = new Promise<void>((resolve) => (server.onclose = resolve));
      await server.connect(new StdioServerTransport());
      await closed;
      await local?.close();
    });
}
