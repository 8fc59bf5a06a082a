import { startTestServer, type TestServer } from './server-helpers.js';

/**
 * A Capsule server on 127.0.0.1:0 and the options that point the official E2B SDKs at it.
 * Every SDK call in the e2b-* tests is configured with these; E2B_DOMAIN is unroutable as well,
 * so a call that missed its options would fail instead of leaving the machine.
 */
export interface E2bTestServer extends TestServer {
  /** `e2b_` + the hex of the server's `cap_` key. */
  e2bKey: string;
  opts: { apiKey: string; apiUrl: string; sandboxUrl: string; domain: string; requestTimeoutMs: number };
}

export async function startE2bServer(): Promise<E2bTestServer> {
  const server = await startTestServer();
  const e2bKey = `e2b_${server.apiKey.slice('cap_'.length)}`;
  process.env.E2B_DOMAIN = 'capsule.invalid';
  process.env.E2B_API_URL = server.url;
  process.env.E2B_SANDBOX_URL = server.url;
  process.env.E2B_API_KEY = e2bKey;
  return {
    ...server,
    e2bKey,
    opts: { apiKey: e2bKey, apiUrl: server.url, sandboxUrl: server.url, domain: 'capsule.invalid', requestTimeoutMs: 30_000 },
  };
}
