import { Artifacts, type UsageSample } from './artifacts.js';
import { Contexts, runCode, type Execution, type RunCodeOptions } from './code.js';
import { Commands } from './commands.js';
import { resolveConfig, type ConnectionOptions } from './config.js';
import { Files } from './files.js';
import { callOptions, HttpClient } from './http.js';
import { errorFromStreamEvent, type CapsuleError } from './errors.js';
import type { ApplyResult, CallOptions, CapacityInfo, Changes, NetworkPolicyInput, PortUrl, SandboxInfo, SandboxPage, SandboxSpecInput, SandboxState, SnapshotInfo } from './types.js';

export interface CreateOptions extends ConnectionOptions {
  /** Free-form labels to find the sandbox by later (`Sandbox.list({ metadata })`). */
  metadata?: Record<string, string>;
  /**
   * When the server cannot back the sandbox now, wait up to this long for room (first come first
   * served) instead of failing at once; then `UnavailableError` (CAPACITY_EXHAUSTED) or, at the
   * tenant's quota, `QuotaExceededError`. At most the server's `maxWaitMs` (`Sandbox.capacity()`).
   * The call's deadline grows by as much. @default 0: refused at once
   */
  waitForCapacityMs?: number;
}

export interface ListOptions extends ConnectionOptions {
  /** Only sandboxes in these states. @default every state */
  state?: SandboxState | SandboxState[];
  /** Only sandboxes whose metadata has all these pairs. */
  metadata?: Record<string, string>;
  /** Page size. @default the server's (50) */
  limit?: number;
  /** `nextCursor` of the previous page. */
  cursor?: string;
}

/** One fork: a sandbox to use, or why it could not be made. */
export type ForkEntry = { sandbox: Sandbox } | { error: CapsuleError };

export interface ForkOutcome {
  /** The one snapshot every fork was made from. */
  snapshot: SnapshotInfo;
  /** In order, one per fork asked for. */
  forks: ForkEntry[];
}

/**
 * A sandbox on a Capsule server. `Sandbox.create()` makes one; `Sandbox.connect(id)` picks up one
 * made elsewhere. Every method takes `{ timeoutMs, signal }` as its last argument.
 *
 * ```ts
 * const sandbox = await Sandbox.create({ limits: { memoryBytes: 256 * 2 ** 20 } });
 * const result = await sandbox.commands.run(['python3', '-c', 'print(6 * 7)']);
 * await sandbox.kill();
 * ```
 */
export class Sandbox {
  readonly sandboxId: string;
  readonly commands: Commands;
  readonly files: Files;
  /** Files collected into the server's artifact store, by reference. */
  readonly artifacts: Artifacts;
  /** Interpreter contexts that keep state between `runCode` calls. */
  readonly contexts: Contexts;
  private lastInfo: SandboxInfo;

  private constructor(
    private readonly http: HttpClient,
    info: SandboxInfo,
  ) {
    this.sandboxId = info.sandboxId;
    this.lastInfo = info;
    const base = `/v1/sandboxes/${encodeURIComponent(info.sandboxId)}`;
    this.commands = new Commands(http, base);
    this.files = new Files(http, base);
    this.artifacts = new Artifacts(http, info.sandboxId);
    this.contexts = new Contexts(http, base);
  }

  /** Creates a sandbox from `spec` (safe defaults fill the rest) and returns once it runs. */
  static async create(spec?: SandboxSpecInput, options: CreateOptions = {}): Promise<Sandbox> {
    const http = new HttpClient(resolveConfig(options));
    const wait = options.waitForCapacityMs;
    const info = await http.json<SandboxInfo>({
      method: 'POST',
      path: '/v1/sandboxes',
      json: { spec, metadata: options.metadata, ...(wait !== undefined ? { waitForCapacityMs: wait } : {}) },
      // The wait for room is on top of the create itself.
      timeoutMs: http.config.timeoutMs + (wait ?? 0),
      signal: options.signal,
    });
    return new Sandbox(http, info);
  }

  /** What the server can still admit (sandbox slots, memory, pids, disk) and this tenant's quota. */
  static async capacity(options: ConnectionOptions = {}): Promise<CapacityInfo> {
    const http = new HttpClient(resolveConfig(options));
    return http.json<CapacityInfo>({ method: 'GET', path: '/v1/capacity', signal: options.signal });
  }

  /** Connects to an existing sandbox; `SandboxNotFoundError` if it is unknown to this API key. */
  static async connect(sandboxId: string, options: ConnectionOptions = {}): Promise<Sandbox> {
    const http = new HttpClient(resolveConfig(options));
    return new Sandbox(http, await getInfo(http, sandboxId, options));
  }

  /** One page of this tenant's sandboxes, newest first. */
  static async list(options: ListOptions = {}): Promise<SandboxPage> {
    const http = new HttpClient(resolveConfig(options));
    const states = options.state === undefined ? undefined : [options.state].flat();
    return http.json<SandboxPage>({
      method: 'GET',
      path: '/v1/sandboxes',
      query: {
        state: states?.join(','),
        metadata: Object.entries(options.metadata ?? {}).map(([key, value]) => `${key}=${value}`),
        limit: options.limit,
        cursor: options.cursor,
      },
      signal: options.signal,
    });
  }

  /** Every matching sandbox, fetching page after page as the loop asks for more. */
  static async *listAll(options: Omit<ListOptions, 'cursor'> = {}): AsyncGenerator<SandboxInfo, void, undefined> {
    let cursor: string | undefined;
    do {
      const page = await Sandbox.list({ ...options, cursor });
      yield* page.sandboxes;
      cursor = page.nextCursor ?? undefined;
    } while (cursor !== undefined);
  }

  /** What was last heard from the server about this sandbox (see `getInfo()` for fresh). */
  get info(): SandboxInfo {
    return this.lastInfo;
  }

  async getInfo(options: CallOptions = {}): Promise<SandboxInfo> {
    return this.remember(await getInfo(this.http, this.sandboxId, options));
  }

  /** Ends the sandbox and everything in it; returns its final info (state `killed`). */
  async kill(options: CallOptions = {}): Promise<SandboxInfo> {
    return this.remember(await this.http.json<SandboxInfo>({ method: 'DELETE', path: this.path, ...callOptions(options) }));
  }

  /** Sets the sandbox to end `ttlMs` from now; it may shorten or extend its life. */
  async setTimeout(ttlMs: number, options: CallOptions = {}): Promise<SandboxInfo> {
    return this.remember(await this.http.json<SandboxInfo>({ method: 'POST', path: `${this.path}/timeout`, json: { ttlMs }, ...callOptions(options) }));
  }

  /** Extends the sandbox's life by its spec's `ttlMs` from now. */
  async keepAlive(options: CallOptions = {}): Promise<SandboxInfo> {
    return this.remember(await this.http.json<SandboxInfo>({ method: 'POST', path: `${this.path}/keepalive`, ...callOptions(options) }));
  }

  /**
   * Replaces the sandbox's network policy (fields left out take their defaults: mode `none`, no
   * allow list, no handles). New connections follow it at once. A sandbox created with mode
   * `none` cannot gain a network: `InvalidSpecError` with code `BACKEND_CANNOT_ENFORCE`.
   */
  async setNetwork(policy: NetworkPolicyInput, options: CallOptions = {}): Promise<SandboxInfo> {
    return this.remember(await this.http.json<SandboxInfo>({ method: 'PUT', path: `${this.path}/network`, json: policy, ...callOptions(options) }));
  }

  /**
   * Pauses the sandbox. `keepMemory` (@default true) keeps processes and their memory; the
   * answer's `pause` says whether it survives a server restart (gVisor: yes; namespace: no).
   */
  async pause(options: CallOptions & { keepMemory?: boolean } = {}): Promise<SandboxInfo> {
    const json = options.keepMemory === undefined ? {} : { keepMemory: options.keepMemory };
    return this.remember(await this.http.json<SandboxInfo>({ method: 'POST', path: `${this.path}/pause`, json, ...callOptions(options) }));
  }

  /** Continues a paused sandbox (processes too, when its pause kept memory). */
  async resume(options: CallOptions = {}): Promise<SandboxInfo> {
    return this.remember(await this.http.json<SandboxInfo>({ method: 'POST', path: `${this.path}/resume`, ...callOptions(options) }));
  }

  /**
   * A signed URL that reaches `port` inside the sandbox through the server (HTTP and WebSocket),
   * for a browser or any client that cannot send the API key. The sandbox needs no network.
   * @default expiresInMs 3600000 (1 hour; at most 7 days)
   */
  async portUrl(port: number, options: CallOptions & { expiresInMs?: number } = {}): Promise<PortUrl> {
    const json = { port, ...(options.expiresInMs !== undefined && { expiresInMs: options.expiresInMs }) };
    return this.http.json<PortUrl>({ method: 'POST', path: `${this.path}/port-urls`, json, ...callOptions(options) });
  }

  /**
   * A snapshot of this sandbox: root and workspace at one instant (it is frozen for it, its
   * processes go on). `Sandbox.create({ snapshot: info.snapshotId })` makes a sandbox from it.
   * `mode: 'full'` (gVisor) keeps its processes and memory too: a sandbox made from it resumes them.
   * `includeVolumes` keeps a copy of each mounted volume as well (`info.volumes` says which);
   * `Volumes.createFrom` makes a volume of a copy.
   */
  async snapshot(options: CallOptions & { name?: string; mode?: 'filesystem' | 'full'; includeVolumes?: boolean } = {}): Promise<SnapshotInfo> {
    const json = {
      ...(options.name !== undefined ? { name: options.name } : {}),
      ...(options.mode ? { mode: options.mode } : {}),
      ...(options.includeVolumes !== undefined ? { includeVolumes: options.includeVolumes } : {}),
    };
    return this.http.json<SnapshotInfo>({ method: 'POST', path: `${this.path}/snapshots`, json, ...callOptions(options) });
  }

  /**
   * `count` new sandboxes from one snapshot of this one (up to 100); each fork on its own. With
   * `mode: 'full'` (gVisor) each fork resumes this sandbox's processes, memory and interpreter contexts.
   */
  async fork(count: number, options: CallOptions & { metadata?: Record<string, string>; mode?: 'filesystem' | 'full' } = {}): Promise<ForkOutcome> {
    const json = { count, ...(options.mode ? { mode: options.mode } : {}), ...(options.metadata ? { metadata: options.metadata } : {}) };
    type Wire = { snapshot: SnapshotInfo; forks: ({ sandbox: SandboxInfo } | { error: { code: string; message: string } })[] };
    const reply = await this.http.json<Wire>({ method: 'POST', path: `${this.path}/fork`, json, ...callOptions(options) });
    return {
      snapshot: reply.snapshot,
      forks: reply.forks.map((entry) => ('sandbox' in entry ? { sandbox: new Sandbox(this.http, entry.sandbox) } : { error: errorFromStreamEvent(entry.error) })),
    };
  }

  /** What changed against the snapshot or template this sandbox came from (or `since` a snapshot). */
  async changes(options: CallOptions & { since?: string } = {}): Promise<Changes> {
    return this.http.json<Changes>({ method: 'GET', path: `${this.path}/changes`, query: { since: options.since }, ...callOptions(options) });
  }

  /** Applies the changes of `fork` (a fork of this sandbox); `ConflictError` with `details.paths` when both changed them. */
  async applyChanges(fork: Sandbox | string, options: CallOptions = {}): Promise<ApplyResult> {
    const from = typeof fork === 'string' ? fork : fork.sandboxId;
    return this.http.json<ApplyResult>({ method: 'POST', path: `${this.path}/changes/apply`, json: { from }, ...callOptions(options) });
  }

  /** CPU, memory and disk use over time: a sample every 5 s (the last 120) plus one taken now. */
  async getMetrics(options: CallOptions = {}): Promise<UsageSample[]> {
    return (await this.http.json<{ samples: UsageSample[] }>({ method: 'GET', path: `${this.path}/metrics`, ...callOptions(options) })).samples;
  }

  /**
   * Runs code in an interpreter context that keeps its variables between calls (`contextId`, or
   * the default context of `language`, python by default). Output and results reach the
   * callbacks as they happen; the code's own exception is `execution.error`, a limit that ended
   * it `execution.limit`.
   */
  runCode(code: string, options: RunCodeOptions = {}): Promise<Execution> {
    return runCode(this.http, this.path, code, options);
  }

  private get path(): string {
    return `/v1/sandboxes/${encodeURIComponent(this.sandboxId)}`;
  }

  private remember(info: SandboxInfo): SandboxInfo {
    this.lastInfo = info;
    return info;
  }
}

async function getInfo(http: HttpClient, sandboxId: string, options: CallOptions): Promise<SandboxInfo> {
  return http.json<SandboxInfo>({ method: 'GET', path: `/v1/sandboxes/${encodeURIComponent(sandboxId)}`, ...callOptions(options) });
}

