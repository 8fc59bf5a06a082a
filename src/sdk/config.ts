import type { Transport } from '../wire/transport.js';

/** Where the server is and who the caller is. Every SDK entry point takes these. */
export interface ConnectionOptions {
  /** Base URL of `capsule serve`. @default process.env.CAPSULE_URL ?? 'http://127.0.0.1:7070' */
  url?: string;
  /** API key sent as `Authorization: Bearer`. @default process.env.CAPSULE_API_KEY */
  apiKey?: string;
  /** Deadline of each request (not of a process's run). @default 60000 */
  timeoutMs?: number;
  /** Cancels the call. */
  signal?: AbortSignal;
  /**
   * What carries the calls instead of HTTP to `url`: the server hands its own tools (MCP) one
   * that answers them in its process. Not for applications. @default HTTP
   */
  transport?: Transport;
}

export interface ResolvedConfig {
  url: string;
  apiKey: string | undefined;
  timeoutMs: number;
  transport?: Transport;
}

export const DEFAULT_URL = 'http://127.0.0.1:7070';
export const DEFAULT_REQUEST_TIMEOUT_MS = 60_000;

/** Options win over the environment; the environment wins over the defaults. */
export function resolveConfig(options: ConnectionOptions = {}, env: NodeJS.ProcessEnv = process.env): ResolvedConfig {
  const url = options.url ?? nonEmpty(env.CAPSULE_URL) ?? DEFAULT_URL;
  return {
    url: url.replace(/\/+$/, ''),
    apiKey: options.apiKey ?? nonEmpty(env.CAPSULE_API_KEY),
    timeoutMs: options.timeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS,
    ...(options.transport && { transport: options.transport }),
  };
}

function nonEmpty(value: string | undefined): string | undefined {
  return value === undefined || value === '' ? undefined : value;
}
