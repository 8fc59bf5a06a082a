/**
 * The console's only way to the server: the public API, with the session key as a Bearer key.
 * Every failure becomes an ApiError carrying the API's code, message and hint.
 */
import type { ErrorBody } from '../../src/wire/index.js';

export interface ApiErrorBody {
  code: string;
  message: string;
  hint?: string;
  requestId?: string;
  details?: ErrorBody['details'];
}

export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly body: ApiErrorBody,
  ) {
    super(`${body.code}: ${body.message}`);
  }
}

/** The key every call sends; set by the session module. */
let bearer: string | undefined;
const signedOutListeners = new Set<() => void>();

export function setBearer(key: string | undefined): void {
  bearer = key;
}

/** Called when the server says the session key is no longer good (expired, revoked, restarted). */
export function onSignedOut(listener: () => void): () => void {
  signedOutListeners.add(listener);
  return () => signedOutListeners.delete(listener);
}

export interface CallOptions {
  method?: 'GET' | 'POST' | 'PUT' | 'DELETE';
  /** A JSON body. */
  body?: unknown;
  /** Raw bytes (a file, stdin). */
  raw?: BodyInit;
  /** The tenant an operator acts in (X-Capsule-Tenant). */
  tenant?: string | undefined;
  query?: Record<string, string | number | boolean | undefined>;
  signal?: AbortSignal;
  /** A key other than the session's (signing in with an API key). */
  key?: string;
}

export function url(path: string, query?: CallOptions['query']): string {
  const params = new URLSearchParams();
  for (const [name, value] of Object.entries(query ?? {})) if (value !== undefined && value !== '') params.set(name, String(value));
  const text = params.toString();
  return text === '' ? path : `${path}?${text}`;
}

export async function call(path: string, options: CallOptions = {}): Promise<Response> {
  const headers: Record<string, string> = {};
  const key = options.key ?? bearer;
  if (key) headers.authorization = `Bearer ${key}`;
  if (options.tenant) headers['x-capsule-tenant'] = options.tenant;
  let body: BodyInit | undefined = options.raw;
  if (options.body !== undefined) {
    headers['content-type'] = 'application/json';
    body = JSON.stringify(options.body);
  } else if (options.raw !== undefined) {
    headers['content-type'] = 'application/octet-stream';
  }
  let response: Response;
  try {
    response = await fetch(url(path, options.query), { method: options.method ?? 'GET', headers, body, signal: options.signal, credentials: 'omit' });
  } catch (error) {
    if ((error as Error).name === 'AbortError') throw error;
    throw new ApiError(0, {
      code: 'SERVER_UNREACHABLE',
      message: `the Capsule server did not answer (${(error as Error).message})`,
      hint: 'Check that capsule serve is running, then reload.',
    });
  }
  if (response.ok) return response;
  const text = await response.text();
  let parsed: ApiErrorBody;
  try {
    parsed = JSON.parse(text) as ApiErrorBody;
    if (typeof parsed.code !== 'string') throw new Error('not an error body');
  } catch {
    parsed = { code: `HTTP_${response.status}`, message: text.slice(0, 300) || response.statusText };
  }
  if (response.status === 401 && options.key === undefined) for (const listener of signedOutListeners) listener();
  throw new ApiError(response.status, parsed);
}

export async function json<T>(path: string, options: CallOptions = {}): Promise<T> {
  const response = await call(path, options);
  return (response.status === 204 ? undefined : await response.json()) as T;
}

/**
 * The lines of an NDJSON response as they arrive. A line `{type: "error"}` (a failure after
 * the stream started) is thrown as an ApiError.
 */
export async function* ndjson<T>(response: Response): AsyncGenerator<T> {
  const reader = response.body?.getReader();
  if (!reader) return;
  const decoder = new TextDecoder();
  let buffered = '';
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      buffered += decoder.decode(value, { stream: true });
      let newline: number;
      while ((newline = buffered.indexOf('\n')) >= 0) {
        const line = buffered.slice(0, newline);
        buffered = buffered.slice(newline + 1);
        if (line === '') continue;
        const event = JSON.parse(line) as T & { type?: string; error?: ApiErrorBody };
        if (event.type === 'error' && event.error) throw new ApiError(500, event.error);
        yield event as T;
      }
    }
  } finally {
    reader.releaseLock();
  }
}

export function base64ToBytes(data: string): Uint8Array {
  const binary = atob(data);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return bytes;
}

/** Any thrown value as an error body to show. */
export function errorBody(error: unknown): ApiErrorBody {
  if (error instanceof ApiError) return error.body;
  return { code: 'CONSOLE_ERROR', message: error instanceof Error ? error.message : String(error), hint: 'Reload the page; if it persists, report it with the browser console output.' };
}
