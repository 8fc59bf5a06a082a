import { SandboxError } from '../errors/index.js';
import { parseSpec, type BackendName, type OperatorMaxima, type SandboxSpec } from '../sandbox-spec/index.js';
import type { Backend, BackendSandbox } from '../backends/backend.js';
import type { HostMount } from '../host/mount-roots.host.js';
import type { SandboxRecordStore } from '../store/index.js';
import type { SandboxInfo } from '../wire/index.js';
import type { EngineEvent } from './events.js';
import type { MountGrant } from './mounts.js';
import { snapshot, type LiveSandbox } from './sandbox-table.js';

/**
 * What the engine lends its start-up to take back the sandboxes the previous server left: its
 * records, backends and the few operations on its table that a sandbox's way back needs.
 */
export interface RestartContext {
  store?: SandboxRecordStore;
  backends: ReadonlyMap<BackendName, Backend>;
  maxima: OperatorMaxima;
  now: () => number;
  onEvent: (event: EngineEvent) => void;
  backend(name: BackendName): Backend;
  mountsFor(spec: SandboxSpec, grant: MountGrant): Promise<HostMount[]>;
  /** The host directories of the record's volumes (the tenant's, checked as at create). */
  volumesOf(record: SandboxInfo): string[];
  /** A table entry for a record kept over the restart, charged to the host and its tenant until it ends. */
  restoreEntry(record: SandboxInfo): LiveSandbox;
  attach(entry: LiveSandbox, sandbox: BackendSandbox): void;
  /** Its processes (and interpreter drivers) taken over from the reattached sandbox. */
  adoptProcesses(entry: LiveSandbox, sandbox: BackendSandbox): void;
  markRunning(entry: LiveSandbox, sinceMs: number): void;
  /** Saves a sandbox that stays paused and schedules its TTL. */
  keepPaused(entry: LiveSandbox): void;
  end(entry: LiveSandbox, state: 'expired' | 'failed', reason: string): Promise<void>;
}

/**
 * Start-up: every sandbox the store says was live. Those whose supervisor outlived the previous
 * server are taken over as they run; those that had one which is gone end with the reason; those
 * the host failed to take over, and the rest (started by a server without supervision), are
 * recovered on their files. What nobody took over is removed by the backends' reconcile.
 */
export async function takeBackSandboxes(ctx: RestartContext): Promise<void> {
  endUnreadable(ctx);
  const live = ctx.store?.listLive() ?? [];
  const reattached = new Map<string, BackendSandbox>();
  const lost = new Map<string, string>();
  const notTaken = new Map<string, string>();
  for (const record of live) {
    const outcome = await tryReattach(ctx, record);
    if (outcome?.sandbox) reattached.set(record.sandboxId, outcome.sandbox);
    else if (outcome?.lost !== undefined) lost.set(record.sandboxId, outcome.lost);
    else if (outcome?.notTaken !== undefined) notTaken.set(record.sandboxId, outcome.notTaken);
  }
  const kept = new Set(reattached.keys());
  // What is left of a lost sandbox (workspace, namespace, bundle) goes with the rest.
  const liveIds = new Set(live.map((r) => r.sandboxId).filter((id) => !lost.has(id)));
  for (const backend of ctx.backends.values()) await backend.reconcile(liveIds, kept);
  for (const record of live) {
    const sandbox = reattached.get(record.sandboxId);
    const why = lost.get(record.sandboxId);
    if (sandbox) resumeReattached(ctx, record, sandbox);
    else if (why !== undefined) await ctx.end(ctx.restoreEntry(record), 'failed', `crashed: ${why}`);
    else await recover(ctx, record, notTaken.get(record.sandboxId));
  }
}

/**
 * Live rows whose record cannot be read: nothing of them can be reattached or recovered, so
 * each ends, readable again, with the reason (its host resources go with reconcile: it is not
 * in the live set). The spec it shows is the default one, as the reason says.
 */
function endUnreadable(ctx: RestartContext): void {
  const { store } = ctx;
  for (const row of store?.listUnreadableLive?.() ?? []) {
    const now = new Date(ctx.now()).toISOString();
    const info: SandboxInfo = {
      sandboxId: row.sandboxId,
      tenantId: row.tenantId,
      state: 'failed',
      backend: 'namespace',
      spec: parseSpec({}, ctx.maxima),
      metadata: row.metadata,
      createdAt: row.createdAt,
      expiresAt: now,
      endedAt: now,
      endReason: `crashed: its stored record was unreadable after a restart (${row.error}); its processes and files were removed, and the spec shown is the default, not its own`,
    };
    store?.upsert(info);
    ctx.onEvent({ type: 'sandbox.crashed', sandbox: info });
  }
}

/**
 * A running record's sandbox taken over from its supervisor; `lost` with the reason when it
 * had one that is gone (SANDBOX_CRASHED: the sandbox ended); `notTaken` with the reason when the
 * host failed to take it over (a mount root, its network, a supervisor slow to answer): that
 * is not the sandbox's end, and it is recovered on its files; undefined when it never had a
 * supervisor (or its TTL ran out meanwhile).
 */
async function tryReattach(ctx: RestartContext, record: SandboxInfo): Promise<{ sandbox?: BackendSandbox; lost?: string; notTaken?: string } | undefined> {
  if (Date.parse(record.expiresAt) <= ctx.now()) return undefined;
  const backend = ctx.backends.get(record.spec.backend);
  if (!backend?.reattach) return undefined;
  // Paused and held by its supervisor (a namespace sandbox, frozen or files-only); a backend
  // that restores its pauses from disk (gVisor's checkpoints) has none held to take over.
  const heldPaused = record.state === 'paused' && record.pause?.survivesRestart === true && backend.restore === undefined;
  if (record.state !== 'running' && !heldPaused) return undefined;
  try {
    // The roots must still exist and pass the checks; volumes are the tenant's, as at create.
    const mounts = await ctx.mountsFor(record.spec, 'all');
    const sandbox = await backend.reattach(record.sandboxId, record.spec, { tenantId: record.tenantId, mounts, volumes: ctx.volumesOf(record) });
    return sandbox ? { sandbox } : undefined;
  } catch (error) {
    const message = (error as Error).message;
    if (error instanceof SandboxError && error.code === 'SANDBOX_CRASHED') return { lost: message };
    return { notTaken: `could not reattach after the restart: ${message}` };
  }
}

/**
 * A sandbox taken over from its supervisor: its processes, with what they wrote meanwhile. A
 * paused one stays paused (its TTL as the pause left it) until resumed.
 */
function resumeReattached(ctx: RestartContext, record: SandboxInfo, sandbox: BackendSandbox): void {
  const entry = ctx.restoreEntry(record);
  ctx.attach(entry, sandbox);
  ctx.adoptProcesses(entry, sandbox);
  if (record.state === 'paused') ctx.keepPaused(entry);
  else ctx.markRunning(entry, ctx.now());
  ctx.onEvent({ type: 'sandbox.recovered', sandbox: snapshot(entry) });
}

/**
 * A sandbox that was live when Capsule stopped. Paused to disk (a gVisor checkpoint), it stays
 * paused with its processes until resumed; otherwise its files are kept and its processes are
 * gone. `notTaken`: why its supervisor's sandbox could not be taken over (the reason of its
 * `sandbox.recovered` event).
 */
async function recover(ctx: RestartContext, record: SandboxInfo, notTaken?: string): Promise<void> {
  const entry = ctx.restoreEntry(record);
  if (Date.parse(record.expiresAt) <= ctx.now()) {
    await ctx.end(entry, 'expired', 'ttl expired while the server was down');
    return;
  }
  try {
    const backend = ctx.backend(record.spec.backend);
    // The grant was checked at create; the roots must still exist and still pass the checks.
    const mounts = await ctx.mountsFor(record.spec, 'all');
    const volumes = ctx.volumesOf(record);
    if (record.state === 'paused' && record.pause?.survivesRestart && backend.restore) {
      ctx.attach(entry, await backend.restore(record.sandboxId, record.spec, { mounts, volumes }));
      ctx.keepPaused(entry);
    } else {
      ctx.attach(entry, await backend.create(record.spec, { id: record.sandboxId, reuseWorkspace: true, mounts, volumes, tenantId: record.tenantId }));
      delete entry.info.pause;
      ctx.markRunning(entry, ctx.now());
    }
    ctx.onEvent({ type: 'sandbox.recovered', sandbox: snapshot(entry), ...(notTaken !== undefined ? { reason: notTaken } : {}) });
  } catch (error) {
    await ctx.end(entry, 'failed', `lost in a server restart: ${(error as Error).message}`);
  }
}
