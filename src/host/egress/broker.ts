import { request as httpRequest, type IncomingMessage, type ServerResponse } from 'node:http';
import { request as httpsRequest } from 'node:https';
import { chmod, mkdir, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { SandboxError } from '../../errors/index.js';
import { readDecoded, UndecodableBodyError } from './broker-body.js';
import { parseBrokerTarget, pathUnder } from './broker-path.js';

/** What the operator registers: how one named handle reaches one upstream with one credential. */
export interface BrokerHandle {
  /** The name a spec lists in `network.handles`, e.g. `docs.read`. */
  name: string;
  /** Base URL requests are forwarded under, e.g. `https://api.example.com/v1`. */
  upstream: string;
  /** Allowed methods, upper case. */
  methods: string[];
  /** Allowed path prefixes below the base URL, segment-wise (`/docs` allows `/docs/x`, not `/docsx`). */
  pathPrefixes: string[];
  /** Name of the registered secret this handle injects. */
  secret: string;
  /** Headers added upstream; `{{secret}}` is replaced by the secret, e.g. `Bearer {{secret}}`. */
  headers: Record<string, string>;
  /** Response bytes passed back; the rest is dropped and `X-Capsule-Truncated: true` is set. */
  maxResponseBytes: number;
  /** PEM file of the CA that signs an `https:` upstream's certificate, when not a public one. */
  caFile?: string;
  /**
   * Tenants whose sandboxes may name this handle: the operator's grant. Absent, only the
   * operator's own tenant (`default`) may. A tenant not listed cannot create a sandbox naming the
   * handle, set a policy naming it, or spend it through the broker.
   * @default ['default']
   */
  tenants?: string[];
}

export type BrokerCode =
  | 'BROKER_UNKNOWN_HANDLE' | 'BROKER_METHOD_NOT_ALLOWED' | 'BROKER_PATH_NOT_ALLOWED' | 'BROKER_BAD_PATH' | 'BROKER_UPSTREAM_FAILED' | 'BROKER_BAD_REQUEST';

/** The tenant of the operator's own key (the store's DEFAULT_TENANT): ungranted handles are its. */
export const OPERATOR_TENANT = 'default';

export interface BrokerLogEntry {
  sandboxId: string;
  handle: string;
  method: string;
  path: string;
  status: number;
  code?: BrokerCode;
  truncated?: boolean;
}

export interface CredentialBrokerOptions {
  /** Directory holding `secrets/` (0700, files 0600) and `handles.json`. */
  dir: string;
  /** Receives one entry per request; entries never hold headers or bodies. */
  log?: (entry: BrokerLogEntry) => void;
  upstreamTimeoutMs?: number;
}

/** The caller of one broker request, as the proxy identified it. */
export interface BrokerCaller {
  sandboxId: string;
  /** The sandbox's tenant. @default OPERATOR_TENANT (one-shot runs of the local operator) */
  tenantId?: string;
  handles: ReadonlySet<string>;
}

/** The host name sandboxes use to reach the broker: `http://broker.capsule/<handle>/<path>`. */
export const BROKER_HOST = 'broker.capsule';
const REDACTED = Buffer.from('[REDACTED]');
const MAX_REQUEST_BYTES = 8 * 1024 * 1024;
const NAME = /^[a-z0-9][a-z0-9._-]{0,63}$/;
/** A tenant id as the key store writes them (TENANT_ID_PATTERN). */
const TENANT = /^[a-z0-9][a-z0-9_-]{0,63}$/;
/** Headers of the sandbox's request that are passed upstream; everything else is dropped. */
const FORWARDED_REQUEST_HEADERS = ['accept', 'accept-language', 'content-type', 'content-length', 'user-agent', 'if-none-match', 'if-modified-since'];
const DROPPED_RESPONSE_HEADERS = new Set(['content-length', 'transfer-encoding', 'connection', 'keep-alive', 'content-encoding']);

/**
 * Uses credentials on a sandbox's behalf. Secrets live in files only root can read; no method
 * returns one, and every byte going back to the sandbox is scrubbed of the secret and of the
 * headers made from it, so an upstream that echoes the request cannot hand it over.
 */
export class CredentialBroker {
  private readonly dir: string;
  private readonly log: (entry: BrokerLogEntry) => void;
  private readonly upstreamTimeoutMs: number;
  private handles = new Map<string, BrokerHandle>();
  /** `handles.json`'s mtime and size when it was read; a change is read again (a revoked grant applies at once). */
  private loadedVersion: string | undefined;

  constructor(options: CredentialBrokerOptions) {
    this.dir = options.dir;
    this.log = options.log ?? (() => undefined);
    this.upstreamTimeoutMs = options.upstreamTimeoutMs ?? 30_000;
  }

  /** Stores a secret (mode 0600 in a 0700 directory). The value is never returned or logged. */
  async setSecret(name: string, value: string): Promise<void> {
    checkName(name, 'secret');
    if (value.length === 0 || /[\r\n\0]/.test(value)) {
      throw new SandboxError('INVALID_ARGUMENT', `secret ${name} must be non-empty and hold no line breaks or NUL bytes`);
    }
    const dir = await this.secretsDir();
    const file = join(dir, name);
    await writeFile(`${file}.tmp`, value, { mode: 0o600 });
    await chmod(`${file}.tmp`, 0o600);
    await rename(`${file}.tmp`, file);
  }

  async removeSecret(name: string): Promise<void> {
    checkName(name, 'secret');
    await rm(join(this.dir, 'secrets', name), { force: true });
  }

  async registerHandle(handle: BrokerHandle): Promise<void> {
    checkName(handle.name, 'handle');
    checkName(handle.secret, 'secret');
    const upstream = new URL(handle.upstream);
    if (upstream.protocol !== 'https:' && upstream.protocol !== 'http:') {
      throw new SandboxError('INVALID_ARGUMENT', `handle ${handle.name}: upstream must be an http(s) URL`);
    }
    if (handle.pathPrefixes.some((prefix) => !prefix.startsWith('/'))) {
      throw new SandboxError('INVALID_ARGUMENT', `handle ${handle.name}: path prefixes must start with /`);
    }
    const badTenant = handle.tenants?.find((tenant) => !TENANT.test(tenant));
    if (badTenant !== undefined) {
      throw new SandboxError('INVALID_ARGUMENT', `handle ${handle.name}: tenant "${badTenant}" is not a tenant id`, {
        hint: 'List tenant ids as API keys carry them (lower-case letters, digits, - and _), e.g. tenants: ["acme"].',
      });
    }
    if (!Object.values(handle.headers).some((value) => value.includes('{{secret}}'))) {
      throw new SandboxError('INVALID_ARGUMENT', `handle ${handle.name}: no header template uses {{secret}}`, {
        hint: 'Set e.g. headers: { Authorization: "Bearer {{secret}}" }.',
      });
    }
    await this.load();
    this.handles.set(handle.name, { ...handle, methods: handle.methods.map((m) => m.toUpperCase()) });
    await this.save();
  }

  async removeHandle(name: string): Promise<void> {
    await this.load();
    this.handles.delete(name);
    await this.save();
  }

  /** Registered handles, as configured (secret names, never secret values). */
  async listHandles(): Promise<BrokerHandle[]> {
    await this.load();
    return [...this.handles.values()].map((h) => ({ ...h, headers: { ...h.headers } }));
  }

  /**
   * The handles among `names` that `tenantId` may not use: unknown ones and ones the operator did
   * not grant to it (the two look the same, so a tenant cannot probe for other tenants' handles).
   */
  async ungranted(tenantId: string, names: readonly string[]): Promise<string[]> {
    await this.load();
    return names.filter((name) => !this.isGranted(name, tenantId));
  }

  private isGranted(name: string, tenantId: string): boolean {
    const handle = this.handles.get(name);
    return handle !== undefined && (handle.tenants ?? [OPERATOR_TENANT]).includes(tenantId);
  }

  /**
   * Serves one sandbox request. `target` is the request target as the sandbox sent it
   * (`/<handle>/<path>[?query]`), before any URL parser decoded or resolved it.
   */
  async serve(caller: BrokerCaller, req: IncomingMessage, res: ServerResponse, target: string): Promise<void> {
    await this.load();
    const method = (req.method ?? 'GET').toUpperCase();
    const parsed = parseBrokerTarget(target);
    const handleName = 'problem' in parsed ? (target.split('/')[1] ?? '') : parsed.handle;
    const path = 'problem' in parsed ? target.slice(handleName.length + 1).split('?')[0] ?? '' : parsed.path;
    const entry: BrokerLogEntry = { sandboxId: caller.sandboxId, handle: handleName, method, path, status: 403 };
    const refuse = (status: number, code: BrokerCode, message: string): void => {
      this.log({ ...entry, status, code });
      req.resume();
      sendJson(res, status, { code, message });
    };
    if ('problem' in parsed) {
      refuse(400, 'BROKER_BAD_PATH', `the path holds ${parsed.problem}; the broker refuses encoded slashes and backslashes, dot segments and empty segments rather than guess what the upstream makes of them. Send the plain path, e.g. http://broker.capsule/<handle>/docs/a`);
      return;
    }
    const handle = this.handles.get(handleName);
    if (!handle || !caller.handles.has(handleName) || !this.isGranted(handleName, caller.tenantId ?? OPERATOR_TENANT)) {
      refuse(403, 'BROKER_UNKNOWN_HANDLE', `handle "${handleName}" is not granted to this sandbox; the operator registers handles and grants them to tenants, and the spec lists them in network.handles`);
      return;
    }
    if (!handle.methods.includes(method)) {
      refuse(403, 'BROKER_METHOD_NOT_ALLOWED', `method ${method} is not allowed for handle "${handleName}" (allowed: ${handle.methods.join(', ')})`);
      return;
    }
    if (!handle.pathPrefixes.some((prefix) => pathUnder(path, prefix))) {
      refuse(403, 'BROKER_PATH_NOT_ALLOWED', `path ${path} is not allowed for handle "${handleName}" (allowed prefixes: ${handle.pathPrefixes.join(', ')})`);
      return;
    }
    let secret: string;
    try {
      secret = (await readFile(join(this.dir, 'secrets', handle.secret), 'utf8')).trim();
    } catch {
      refuse(502, 'BROKER_UPSTREAM_FAILED', `handle "${handleName}" has no usable secret on the host; ask the operator to register it`);
      return;
    }
    const injected = Object.entries(handle.headers).map(([name, template]) => [name.toLowerCase(), template.split('{{secret}}').join(secret)] as const);
    const redact = new Redactor([secret, Buffer.from(secret).toString('base64'), ...injected.map(([, value]) => value)]);
    try {
      const upstream = await this.forward(handle, method, path + parsed.search, req, injected);
      // Decoded first: a secret echoed back gzipped would pass a redaction of the compressed bytes.
      const { body, truncated } = await readDecoded(upstream, handle.maxResponseBytes + redact.longest);
      let clean = redact.buffer(body);
      const cut = truncated || clean.length > handle.maxResponseBytes;
      if (clean.length > handle.maxResponseBytes) clean = clean.subarray(0, handle.maxResponseBytes);
      const headers: Record<string, string | string[]> = {};
      for (const [name, value] of Object.entries(upstream.headers)) {
        if (value === undefined || DROPPED_RESPONSE_HEADERS.has(name)) continue;
        headers[name] = Array.isArray(value) ? value.map((v) => redact.text(v)) : redact.text(value);
      }
      headers['content-length'] = String(clean.length);
      headers['x-capsule-handle'] = handleName;
      if (cut) headers['x-capsule-truncated'] = 'true';
      res.writeHead(upstream.statusCode ?? 502, headers);
      res.end(clean);
      this.log({ ...entry, status: upstream.statusCode ?? 502, truncated: cut });
    } catch (error) {
      const why = redact.text((error as Error).message);
      const what = error instanceof UndecodableBodyError ? 'answer of the upstream' : 'upstream';
      refuse(502, 'BROKER_UPSTREAM_FAILED', `the ${what} of handle "${handleName}" failed: ${why}`);
    }
  }

  private async forward(handle: BrokerHandle, method: string, path: string, req: IncomingMessage, injected: readonly (readonly [string, string])[]): Promise<IncomingMessage> {
    const base = new URL(handle.upstream);
    const headers: Record<string, string> = { 'accept-encoding': 'identity' };
    for (const name of FORWARDED_REQUEST_HEADERS) {
      const value = req.headers[name];
      if (typeof value === 'string') headers[name] = value;
    }
    for (const [name, value] of injected) headers[name] = value;
    const send = base.protocol === 'https:' ? httpsRequest : httpRequest;
    const ca = handle.caFile ? await readFile(handle.caFile) : undefined;
    return new Promise((resolve, reject) => {
      const upstream = send(
        {
          protocol: base.protocol,
          hostname: base.hostname,
          port: base.port || undefined,
          method,
          path: `${base.pathname.replace(/\/$/, '')}${path}`,
          headers,
          timeout: this.upstreamTimeoutMs,
          agent: false,
          ...(ca ? { ca } : {}),
        },
        resolve,
      );
      upstream.once('timeout', () => upstream.destroy(new Error(`no answer within ${this.upstreamTimeoutMs} ms`)));
      upstream.once('error', reject);
      // The sandbox closed its connection: nothing will read the answer.
      const gone = (): void => void upstream.destroy(new Error('the sandbox closed its connection'));
      req.socket.once('close', gone);
      upstream.once('close', () => req.socket.off('close', gone));
      let sent = 0;
      req.on('data', (chunk: Buffer) => {
        sent += chunk.length;
        if (sent > MAX_REQUEST_BYTES) upstream.destroy(new Error(`request body over ${MAX_REQUEST_BYTES} bytes`));
      });
      req.pipe(upstream);
    });
  }

  private async secretsDir(): Promise<string> {
    const dir = join(this.dir, 'secrets');
    await mkdir(dir, { recursive: true, mode: 0o700 });
    await chmod(this.dir, 0o700);
    await chmod(dir, 0o700);
    return dir;
  }

  private async load(): Promise<void> {
    const file = join(this.dir, 'handles.json');
    let version: string;
    try {
      const info = await stat(file);
      version = `${info.mtimeMs}:${info.size}:${info.ino}`;
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== 'ENOENT') throw error;
      version = 'absent';
    }
    if (version === this.loadedVersion) return;
    if (version === 'absent') {
      this.handles = new Map();
    } else {
      let list: BrokerHandle[];
      try {
        list = JSON.parse(await readFile(file, 'utf8')) as BrokerHandle[];
        if (!Array.isArray(list)) throw new Error('it is not a JSON array');
      } catch (error) {
        // No handle is served, and no grant is assumed, until the file reads again.
        throw new SandboxError('HOST_NOT_READY', `the broker's ${file} cannot be read: ${(error as Error).message}`, {
          cause: error,
          hint: 'Fix the file (a JSON array of handles, docs/api.md "Credential broker"); it is read again as soon as it changes.',
        });
      }
      this.handles = new Map(list.map((h) => [h.name, h]));
    }
    this.loadedVersion = version;
  }

  private async save(): Promise<void> {
    await this.secretsDir();
    const file = join(this.dir, 'handles.json');
    await writeFile(`${file}.tmp`, JSON.stringify([...this.handles.values()], null, 2), { mode: 0o600 });
    await rename(`${file}.tmp`, file);
    this.loadedVersion = undefined; // read back on next use: what the file says is what counts
  }
}

function checkName(name: string, what: string): void {
  if (!NAME.test(name)) {
    throw new SandboxError('INVALID_ARGUMENT', `${what} name "${name}" is not valid`, { hint: 'Use lower-case letters, digits, dot, dash and underscore.' });
  }
}

function sendJson(res: ServerResponse, status: number, body: object): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text), connection: 'close' });
  res.end(text);
}

/** Replaces every occurrence of the given values (longest first) with `[REDACTED]`. */
class Redactor {
  private readonly values: Buffer[];
  readonly longest: number;

  constructor(values: string[]) {
    this.values = [...new Set(values.filter((v) => v.length >= 4))].sort((a, b) => b.length - a.length).map((v) => Buffer.from(v));
    this.longest = Math.max(0, ...this.values.map((v) => v.length));
  }

  buffer(input: Buffer): Buffer {
    let output = input;
    for (const value of this.values) {
      const parts: Buffer[] = [];
      let from = 0;
      for (let at = output.indexOf(value, from); at !== -1; at = output.indexOf(value, from)) {
        parts.push(output.subarray(from, at), REDACTED);
        from = at + value.length;
      }
      if (parts.length > 0) output = Buffer.concat([...parts, output.subarray(from)]);
    }
    return output;
  }

  text(input: string): string {
    return this.buffer(Buffer.from(input)).toString('utf8');
  }
}

