/**
 * `startServer` in a process of its own, for tests that measure the server itself (its RSS from
 * /proc/PID/status). Run from dist/ with `node --expose-gc`: the options come as JSON in argv[2]
 * (the API key in CAPSULE_API_KEY), it prints `URL: <url>` once listening, answers an IPC message
 * `gc` with `{ gcDone, memory }` (process.memoryUsage()) after two full collections, and closes gracefully on SIGTERM.
 */
import { startServer, type StartServerOptions } from '../../src/server/bootstrap.js';

const options = JSON.parse(process.argv[2] ?? '{}') as StartServerOptions;
const server = await startServer({ port: 0, ...options, env: process.env });
process.stdout.write(`URL: ${server.url}\n`);

process.on('message', (message) => {
  if (message !== 'gc') return;
  const gc = (globalThis as { gc?: () => void }).gc;
  if (!gc) throw new Error('run with node --expose-gc');
  gc();
  gc();
  process.send?.({ gcDone: true, memory: process.memoryUsage() });
});

process.once('SIGTERM', () => {
  void server.close().then(() => process.exit(0), (error: unknown) => {
    process.stderr.write(`child server close failed: ${(error as Error).message}\n`);
    process.exit(1);
  });
});
