import { mkdtempSync } from 'node:fs';
import { join } from 'node:path';
import { expect } from 'vitest';
import { startServer, type RunningServer, type StartServerOptions } from '../../src/server/bootstrap.js';
import { newApiKey } from '../../src/store/index.js';
import { testDataDir } from '../helpers/sandbox.js';

export interface TestServer {
  server: RunningServer;
  url: string;
  apiKey: string;
  /** fetch against the server with the operator key (or `key`). */
  call(method: string, path: string, options?: CallOptions): Promise<Response>;
  json<T = Record<string, unknown>>(method: string, path: string, options?: CallOptions): Promise<{ status: number; body: T; headers: Headers }>;
}

export interface CallOptions {
  body?: unknown;
  raw?: string | Buffer | ReadableStream<Uint8Array>;
  key?: string | null;
  headers?: Record<string, string>;
}

/**
 * A server on port 0: the engine on the test run's data dir (so expectNoLeaks sees its
 * sandboxes), the database fresh under it.
 */
export async function startTestServer(options: Partial<StartServerOptions> = {}): Promise<TestServer> {
  const apiKey = newApiKey();
  const server = await startServer({
    dataDir: testDataDir(),
    databaseDir: mkdtempSync(join(testDataDir(), 'server-db-')),
    port: 0,
    env: { CAPSULE_API_KEY: apiKey },
    ...options,
  });
  const call = (method: string, path: string, o: CallOptions = {}) => {
    const headers: Record<string, string> = { ...(o.headers ?? {}) };
    const key = o.key === undefined ? apiKey : o.key;
    if (key !== null) headers.authorization = `Bearer ${key}`;
    let body: string | Buffer | ReadableStream<Uint8Array> | undefined = o.raw;
    if (o.body !== undefined) {
      headers['content-type'] = 'application/json';
      body = JSON.stringify(o.body);
    }
    return fetch(`${server.url}${path}`, { method, headers, body, ...(o.raw instanceof ReadableStream ? { duplex: 'half' } : {}) });
  };
  return {
    server,
    url: server.url,
    apiKey,
    call,
    async json<T>(method: string, path: string, o: CallOptions = {}) {
      const response = await call(method, path, o);
      const text = await response.text();
      return { status: response.status, body: (text === '' ? null : JSON.parse(text)) as T, headers: response.headers };
    },
  };
}

/** Reads an NDJSON response to its end. */
export async function readNdjson(response: Response): Promise<Record<string, unknown>[]> {
  const text = await response.text();
  return text
    .split('\n')
    .filter((line) => line !== '')
    .map((line) => JSON.parse(line) as Record<string, unknown>);
}

/** Polls `check` until it returns a value other than undefined, or fails after `timeoutMs`. */
export async function waitFor<T>(check: () => Promise<T | undefined>, { timeoutMs = 30_000, intervalMs = 50, what = 'condition' } = {}): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, intervalMs));
  }
}

export function expectError(body: unknown, code: string): void {
  expect(body).toMatchObject({ code, message: expect.any(String) as unknown, requestId: expect.stringMatching(/^req_/) as unknown });
}
