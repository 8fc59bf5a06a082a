import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

/**
 * The SDK keeps its connections alive between calls, yet a script that uses it must end by itself
 * once its work is done: idle sockets may not hold the process. A child `node` runs the built SDK
 * (dist, as `capsule` and users load it) against a scripted loopback server that would keep an
 * idle connection open for a minute.
 */
const SDK = join(import.meta.dirname, '..', '..', 'dist', 'src', 'sdk', 'index.js');
const SERVER_KEEP_ALIVE_MS = 60_000;

const INFO = { sandboxId: 'abcdefghijklmnopqrst', tenantId: 't', state: 'running', backend: 'namespace', spec: {}, metadata: {}, createdAt: '', expiresAt: '' };
const RESULT = {
  outcome: 'ok', exitCode: 0, signal: null, stdout: 'hi\n', stderr: '', stdoutTruncated: false, stderrTruncated: false,
  stdoutBytes: 3, stderrBytes: 0, durationMs: 1, usage: { memoryPeakBytes: 0, cpuTimeMs: 0, cpuThrottledMs: 0, diskUsedBytes: null }, warnings: [],
};

let server: Server;
let url = '';
const connections = new Set<Socket>();
let requests = 0;
let opened = 0;

beforeAll(async () => {
  server = createServer((req, res) => {
    requests++;
    req.resume();
    req.on('end', () => {
      const path = new URL(req.url ?? '/', 'http://x').pathname;
      if (path.endsWith('/processes')) {
        res.writeHead(200, { 'content-type': 'application/x-ndjson' });
        res.write(`${JSON.stringify({ type: 'start', pid: 1 })}\n`);
        // The rest comes a tick later, as a real process's output does.
        setImmediate(() => res.end(`${JSON.stringify({ type: 'stdout', data: Buffer.from('hi\n').toString('base64') })}\n${JSON.stringify({ type: 'exit', result: RESULT })}\n`));
      } else if (path.endsWith('/files')) {
        res.writeHead(200, { 'content-type': 'application/octet-stream' }).end('x'.repeat(100_000));
      } else {
        res.writeHead(req.method === 'POST' ? 201 : 200, { 'content-type': 'application/json' }).end(JSON.stringify(INFO));
      }
    });
  });
  server.keepAliveTimeout = SERVER_KEEP_ALIVE_MS;
  server.on('connection', (socket: Socket) => {
    opened++;
    connections.add(socket);
    socket.on('close', () => connections.delete(socket));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(async () => {
  server.closeAllConnections();
  await new Promise((resolve) => server.close(resolve));
});

/** The child's script: JSON, streamed NDJSON, a web-stream read cancelled early, then nothing. */
const SCRIPT = `
const { Sandbox } = await import(process.env.SDK);
const sandbox = await Sandbox.create(undefined, { url: process.env.URL });
const result = await sandbox.commands.run(['echo', 'hi']);
await sandbox.getInfo();
const stream = await sandbox.files.read('big', { format: 'stream' });
const reader = stream.getReader();
await reader.read();
await reader.cancel();
await sandbox.commands.run(['echo', 'hi']);
console.log(JSON.stringify({ stdout: result.stdout }));
`;

describe('a script using the SDK', () => {
  it.skipIf(!existsSync(SDK))('exits by itself after its calls, though its connection is kept alive (needs `npm run build`)', async () => {
    const child = spawn(process.execPath, ['--input-type=module', '-e', SCRIPT], {
      env: { PATH: process.env.PATH, SDK, URL: url },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    // A child held by a socket would live until the SDK's idle timeout (30 s) or the server's
    // keep-alive (60 s) closed it; the guard ends it before either, so being held means being
    // killed (code null), whatever the load. A child not held exits with 0 long before the guard.
    const killer = setTimeout(() => child.kill('SIGKILL'), 25_000);
    const code = await new Promise<number | null>((resolve) => child.once('close', resolve));
    clearTimeout(killer);
    expect(stderr).toBe('');
    expect(code, 'the script ended by itself (null: killed while a socket held it)').toBe(0);
    const { stdout: echoed } = JSON.parse(stdout) as { stdout: string };
    expect(echoed).toBe('hi\n');
    // Five calls on at most two connections: a cancelled stream may cost its own, the rest share.
    expect(requests).toBe(5);
    expect(opened).toBeLessThanOrEqual(2);
    expect(connections.size).toBe(0);
  });
});
