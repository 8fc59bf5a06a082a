import {
  Manifest,
  SandboxConfigurationError,
  normalizeSandboxClientCreateArgs,
  type SandboxClient,
  type SandboxClientCreateArgs,
  type SandboxClientOptions,
  type SnapshotSpec,
} from '@openai/agents/sandbox';
import { isSandboxError } from '../errors/index.js';
import { Sandbox, type ConnectionOptions, type SandboxSpecInput } from '../sdk/index.js';
import { CapsuleSandboxSession, materialize, type CapsuleSandboxSessionState } from './openai-session.js';

/** Per-run options of the client (`SandboxRunConfig.options`), over the ones it was made with. */
export interface CapsuleSandboxClientOptions extends SandboxClientOptions {
  /** The sandbox spec: template, backend, limits, network, ttlMs. @default Capsule's safe defaults */
  spec?: SandboxSpecInput;
  /** Labels to find the sandboxes by (`Sandbox.list({ metadata })`). */
  metadata?: Record<string, string>;
}

/** A Capsule snapshot to start from: `{ type: 'capsule', snapshotId: 'snap_...' }`. */
export interface CapsuleSnapshotSpec extends SnapshotSpec {
  type: 'capsule';
  snapshotId: string;
}

/**
 * The OpenAI Agents SDK's sandbox client for Capsule (`SandboxRunConfig.client`): a session is a
 * Capsule sandbox made with the TypeScript SDK, its manifest's files and directories written in
 * before the agent starts. State lives on the server: a RunState keeps only the sandbox id.
 *
 * ```ts
 * const client = new CapsuleSandboxClient({ url, apiKey, spec: { limits: { memoryBytes: 512 * 2 ** 20 } } });
 * const agent = new SandboxAgent({ name: 'coder', capabilities: [shell(), filesystem()] });
 * await run(agent, 'Write and run a test', { sandbox: { client } });
 * ```
 */
export class CapsuleSandboxClient implements SandboxClient<CapsuleSandboxClientOptions, CapsuleSandboxSessionState> {
  readonly backendId = 'capsule';
  private readonly connection: ConnectionOptions;
  private readonly defaults: CapsuleSandboxClientOptions;

  constructor(options: ConnectionOptions & CapsuleSandboxClientOptions = {}) {
    const { url, apiKey, timeoutMs, signal, ...defaults } = options;
    this.connection = { ...(url !== undefined && { url }), ...(apiKey !== undefined && { apiKey }), ...(timeoutMs !== undefined && { timeoutMs }), ...(signal !== undefined && { signal }) };
    this.defaults = defaults;
  }

  async create(args?: SandboxClientCreateArgs<CapsuleSandboxClientOptions> | Manifest, manifestOptions?: CapsuleSandboxClientOptions): Promise<CapsuleSandboxSession> {
    const normalized = normalizeSandboxClientCreateArgs(args, manifestOptions);
    const options = { ...this.defaults, ...normalized.options };
    const snapshotId = capsuleSnapshotId(normalized.snapshot);
    const spec: SandboxSpecInput = { ...options.spec, ...(snapshotId !== undefined && { snapshot: snapshotId }) };
    const sandbox = await Sandbox.create(spec, { ...this.connection, ...(options.metadata !== undefined && { metadata: options.metadata }) });
    try {
      await materialize(sandbox, normalized.manifest);
      const environment = await normalized.manifest.resolveEnvironment();
      return new CapsuleSandboxSession(sandbox, { manifest: normalized.manifest, sandboxId: sandbox.sandboxId, environment, workspaceReady: true });
    } catch (error) {
      // A session that could not be set up is not left running.
      await sandbox.kill().catch(() => undefined);
      throw error;
    }
  }

  async resume(state: CapsuleSandboxSessionState): Promise<CapsuleSandboxSession> {
    const sandbox = await Sandbox.connect(state.sandboxId, this.connection);
    state.environment ??= await state.manifest.resolveEnvironment();
    return new CapsuleSandboxSession(sandbox, state);
  }

  /** Kills the session's sandbox; one already gone is not an error. */
  async delete(state: CapsuleSandboxSessionState): Promise<void> {
    try {
      await (await Sandbox.connect(state.sandboxId, this.connection)).kill();
    } catch (error) {
      if (!isSandboxError(error, 'SANDBOX_NOT_FOUND')) throw error;
    }
  }

  canPersistOwnedSessionState(): boolean {
    return true;
  }

  /** Only the sandbox id: files live in the sandbox, and the environment (secrets too) is resolved again. */
  serializeSessionState(state: CapsuleSandboxSessionState): Promise<Record<string, unknown>> {
    return Promise.resolve({ sandboxId: state.sandboxId });
  }

  deserializeSessionState(state: Record<string, unknown>): Promise<CapsuleSandboxSessionState> {
    if (typeof state.sandboxId !== 'string') return Promise.reject(new SandboxConfigurationError('the serialized Capsule session has no sandboxId', { provider: 'capsule' }));
    const manifest = state.manifest instanceof Manifest ? state.manifest : new Manifest(state.manifest ?? {});
    return Promise.resolve({ sandboxId: state.sandboxId, manifest });
  }
}

/** The Capsule snapshot a spec names; no spec (or a no-op one) starts fresh, any other kind is refused. */
function capsuleSnapshotId(spec: SnapshotSpec | undefined): string | undefined {
  if (spec === undefined || spec.type === 'noop') return undefined;
  if (spec.type === 'capsule' && typeof spec.snapshotId === 'string') return spec.snapshotId;
  throw new SandboxConfigurationError(`CapsuleSandboxClient starts from Capsule snapshots only ({ type: 'capsule', snapshotId: 'snap_...' }), not a '${spec.type}' snapshot spec`, { provider: 'capsule', snapshotType: spec.type });
}
