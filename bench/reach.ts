/**
 * What reaching a sandbox costs: the port proxy's added latency per HTTP request and per
 * WebSocket round trip (the same stdlib Python server run on the host's loopback, reached
 * directly, against the one in a sandbox reached through /v1/sandboxes/ID/ports/P/), and an MCP
 * `exec` tool call (official MCP client, streamable HTTP) against the SDK's `commands.run`.
 *
 *   node dist/bench/reach.js [--n 200] [--json]
 */
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { Agent, request as httpRequest } from 'node:http';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import WebSocket from 'ws';
import { registerMcpHttp } from '../src/mcp/http.js';
import { Sandbox } from '../src/sdk/index.js';
import { startServer } from '../src/server/bootstrap.js';
import { newApiKey } from '../src/store/index.js';
import { summarize, table, timeIt, type Summary } from './stats.js';

const args = process.argv.slice(2);
const N = Number(args[args.indexOf('--n') + 1] ?? 200) || 200;
const asJson = args.includes('--json');
const SCRIPT = readFileSync(join(import.meta.dirname, '..', '..', 'test', 'fixtures', 'port-servers.py'), 'utf8');
const SANDBOX_PORT = 8765;

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      server.close(() => resolve(typeof address === 'object' && address ? address.port : 0));
    });
  });
}

function get(agent: Agent, url: string, headers: Record<string, string>): Promise<void> {
  return new Promise((resolve, reject) => {
    const request = httpRequest(url, { agent, headers }, (response) => {
      response.resume();
      response.once('end', () => (response.statusCode === 200 ? resolve() : reject(new Error(`status ${response.statusCode}`))));
    });
    request.once('error', reject);
    request.end();
  });
}

async function waitOk(check: () => Promise<void>, what: string): Promise<void> {
  const deadline = Date.now() + 30_000;
  for (;;) {
    try {
      await check();
      return;
    } catch (error) {
      if (Date.now() > deadline) throw new Error(`${what}: ${(error as Error).message}`);
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  }
}

/** Round trips of one message each on an open WebSocket. */
async function wsRoundTrips(url: string, headers: Record<string, string>, n: number): Promise<number[]> {
  const socket = new WebSocket(url, { headers });
  await new Promise<void>((resolve, reject) => {
    socket.once('open', () => resolve());
    socket.once('error', reject);
  });
  const samples: number[] = [];
  for (let i = 0; i < n; i++) {
    samples.push(
      await timeIt(
        () =>
          new Promise<void>((resolve) => {
            socket.once('message', () => resolve());
            socket.send(`message ${i}`);
          }),
      ),
    );
  }
  socket.close();
  return samples;
}

async function main(): Promise<void> {
  const dataDir = await mkdtemp(join(tmpdir(), 'capsule-bench-reach-'));
  const scriptPath = join(dataDir, 'port-servers.py');
  const { writeFile } = await import('node:fs/promises');
  await writeFile(scriptPath, SCRIPT);
  const apiKey = newApiKey();
  const server = await startServer({ dataDir, port: 0, env: { CAPSULE_API_KEY: apiKey }, extensions: [registerMcpHttp] });
  const hostPort = await freePort();
  const hostServer = spawn('/usr/bin/python3', [scriptPath, String(hostPort)], { stdio: 'ignore' });
  const connection = { url: server.url, apiKey };
  const sandbox = await Sandbox.create({ limits: { wallClockMs: 600_000 } }, connection);
  const mcp = new Client({ name: 'capsule-bench', version: '1.0.0' });
  try {
    await sandbox.files.write('/workspace/port-servers.py', SCRIPT);
    await sandbox.commands.run(['python3', '/workspace/port-servers.py', String(SANDBOX_PORT)], { background: true });
    const agent = new Agent({ keepAlive: true, maxSockets: 1 });
    const auth = { authorization: `Bearer ${apiKey}` };
    const direct = `http://127.0.0.1:${hostPort}/`;
    const proxied = `${server.url}/v1/sandboxes/${sandbox.sandboxId}/ports/${SANDBOX_PORT}/`;
    await waitOk(() => get(agent, direct, {}), 'the host server');
    await waitOk(() => get(agent, proxied, auth), 'the sandbox server');

    const httpDirect: number[] = [];
    const httpProxied: number[] = [];
    for (let i = 0; i < N; i++) {
      httpDirect.push(await timeIt(() => get(agent, direct, {})));
      httpProxied.push(await timeIt(() => get(agent, proxied, auth)));
    }
    const wsDirect = await wsRoundTrips(`ws://127.0.0.1:${hostPort}/ws`, {}, N);
    const wsProxied = await wsRoundTrips(`${proxied.replace('http:', 'ws:')}ws`, auth, N);

    await mcp.connect(new StreamableHTTPClientTransport(new URL(`${server.url}/mcp`), { requestInit: { headers: auth } }));
    // As many exec pairs as HTTP requests: an exec's p50 from 80 pairs moved by ±3% between runs.
    const execN = Math.max(10, N);
    const sdkExec: number[] = [];
    const mcpExec: number[] = [];
    for (let i = 0; i < execN; i++) {
      sdkExec.push(await timeIt(() => sandbox.commands.run(['true'])));
      mcpExec.push(await timeIt(() => mcp.callTool({ name: 'exec', arguments: { sandboxId: sandbox.sandboxId, command: ['true'] } })));
    }
    agent.destroy();

    const rows: Summary[] = [
      summarize('HTTP GET, host loopback (direct)', httpDirect),
      summarize('HTTP GET, sandbox port via proxy', httpProxied),
      summarize('WebSocket round trip, direct', wsDirect),
      summarize('WebSocket round trip, via proxy', wsProxied),
      summarize('exec `true`, SDK', sdkExec),
      summarize('exec `true`, MCP tool (HTTP)', mcpExec),
    ];
    const added = {
      httpAddedP50Ms: rows[1]!.p50Ms - rows[0]!.p50Ms,
      wsAddedP50Ms: rows[3]!.p50Ms - rows[2]!.p50Ms,
      mcpOverSdkP50: rows[5]!.p50Ms / rows[4]!.p50Ms,
    };
    if (asJson) {
      process.stdout.write(`${JSON.stringify({ rows, ...added })}\n`);
    } else {
      process.stdout.write(`${table(rows.map((r) => ({ case: r.name, n: r.n, 'p50 ms': r.p50Ms, 'p95 ms': r.p95Ms, 'min ms': r.minMs })))}\n`);
      process.stdout.write(`proxy adds ${added.httpAddedP50Ms.toFixed(2)} ms p50 per HTTP request, ${added.wsAddedP50Ms.toFixed(2)} ms per WebSocket round trip; MCP exec / SDK exec = ${added.mcpOverSdkP50.toFixed(2)}x (p50)\n`);
    }
  } finally {
    await mcp.close().catch(() => undefined);
    await sandbox.kill().catch(() => undefined);
    hostServer.kill('SIGTERM');
    await server.close();
    await rm(dataDir, { recursive: true, force: true });
  }
}

await main();
