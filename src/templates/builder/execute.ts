import { lstat, readdir, rmdir, unlink } from 'node:fs/promises';
import { join } from 'node:path';
import { SandboxError } from '../../errors/index.js';
import type { NetworkPolicyInput } from '../../sandbox-spec/index.js';
import type { BuildLog } from '../build-log.js';
import { hashParts } from '../keys.js';
import type { LayerStore, PendingLayer } from '../layer-store.host.js';
import { copyInto, makeDirInRoot } from '../rootfs/copy-into.host.js';
import { resolveInRoot } from '../rootfs/in-root.js';
import { resolveUserInRoot } from '../rootfs/users.js';
import type { BuildPlan, PlannedStep } from './plan.js';
import { DEFAULT_STEP_LIMITS, type RunStep, type StepResult, type StepRunner } from './step-runner.js';

export interface ExecuteOptions {
  plan: BuildPlan;
  layers: LayerStore;
  contextDir: string;
  log: BuildLog;
  /** Holds keys against garbage collection for the build; true for each that exists. */
  lease: (keys: string[]) => Promise<boolean[]>;
  stepRunner?: StepRunner;
  network: NetworkPolicyInput;
  limits?: Partial<RunStep['limits']>;
  /** Skip every cache lookup: each step makes a fresh layer (under a key of this build's own). */
  noCache: boolean;
  buildId: string;
  file: string;
  signal?: AbortSignal;
}

export interface ExecutedStep {
  step: string;
  instruction: string;
  key: string;
  /** True when the layer came from the cache (or the step only changes the config). */
  cached: boolean;
}

/**
 * Runs a plan: each step that makes a layer is one cache lookup (a hit is a lease and nothing
 * else: no snapshot, no sandbox); a miss snapshots the current layer into a pending layer,
 * applies the step (COPY by the builder itself, RUN through the StepRunner), and publishes it
 * read-only under the step's key. A failing or cancelled step discards its pending layer, so
 * nothing of it remains.
 */
export async function executePlan(options: ExecuteOptions): Promise<{ layer: string; steps: ExecutedStep[] }> {
  const { plan, layers, log } = options;
  let layer = plan.base.layer;
  const executed: ExecutedStep[] = [];
  const total = plan.steps.length;
  for (const step of plan.steps) {
    options.signal?.throwIfAborted();
    const key = options.noCache ? hashParts(step.key, 'no-cache', options.buildId) : step.key;
    log.info(step.step, `step ${step.step}/${total}: ${step.text}`);
    if (step.action === 'config') {
      executed.push({ step: step.step, instruction: step.text, key, cached: true });
      continue;
    }
    if (!options.noCache && (await options.lease([key]))[0]) {
      log.info(step.step, `cached (${key.slice(0, 12)})`);
      layer = key;
      executed.push({ step: step.step, instruction: step.text, key, cached: true });
      continue;
    }
    if (step.action === 'workdir' && (await isDirectoryIn(layers.rootOf(layer), step.workdir!))) {
      executed.push({ step: step.step, instruction: step.text, key, cached: true });
      continue;
    }
    if (step.run) {
      // The runtime makes the step's sandbox from the parent layer; the builder keeps its root.
      const parent = await ensureDirLayer(layer, step.run.cwd, options);
      await runStep(step, parent, key, options);
    } else {
      const pending = await layers.createFrom(layer);
      try {
        await applyStep(step, pending, options);
        await publishStep(pending, step, key, layer, options);
      } catch (error) {
        await layers.discard(pending);
        throw error;
      }
    }
    layer = key;
    executed.push({ step: step.step, instruction: step.text, key, cached: false });
  }
  return { layer, steps: executed };
}

async function isDirectoryIn(root: string, path: string): Promise<boolean> {
  const place = await resolveInRoot(root, path);
  if (!place.exists) return false;
  return (await lstat(place.hostPath)).isDirectory();
}

async function publishStep(pending: PendingLayer, step: PlannedStep, key: string, parent: string, options: ExecuteOptions): Promise<void> {
  options.signal?.throwIfAborted();
  await options.lease([key]);
  await options.layers.publish(pending, { key, parent, source: 'step', description: `${options.file}:${step.line}: ${step.text}`.slice(0, 300) });
}

/**
 * The layer a RUN starts from must hold its working directory (an image's WorkingDir may not
 * exist yet): when it does not, a layer with it made (root's, 0755) comes first.
 */
async function ensureDirLayer(layer: string, dir: string, options: ExecuteOptions): Promise<string> {
  if (await isDirectoryIn(options.layers.rootOf(layer), dir)) return layer;
  const key = hashParts(layer, 'mkdir', dir);
  if ((await options.lease([key]))[0]) return key;
  const pending = await options.layers.createFrom(layer);
  try {
    await makeDirInRoot(pending.root, dir);
    await options.layers.publish(pending, { key, parent: layer, source: 'step', description: `mkdir ${dir}` });
  } catch (error) {
    await options.layers.discard(pending);
    throw error;
  }
  return key;
}

async function applyStep(step: PlannedStep, pending: PendingLayer, options: ExecuteOptions): Promise<void> {
  const where = `${options.file}:${step.line}`;
  if (step.action === 'workdir') {
    await makeDirInRoot(pending.root, step.workdir!);
    return;
  }
  if (step.copy) {
    const owner = step.copy.chown === undefined ? { uid: 0, gid: 0 } : await resolveUserInRoot(pending.root, step.copy.chown);
    if (typeof owner === 'string') {
      throw new SandboxError('INVALID_ARGUMENT', `${where}: --chown=${step.copy.chown}: ${owner}`, { details: { step: step.step, line: step.line } });
    }
    const { selection, dest, chmod } = step.copy;
    await copyInto(selection.entries, { contextDir: options.contextDir, root: pending.root, dest, destIsDir: selection.destIsDir, ...owner, ...(chmod === undefined ? {} : { mode: chmod }), signal: options.signal });
    options.log.info(step.step, `copied ${selection.entries.length} entries to ${dest}`);
  }
}

/**
 * A RUN: the runtime runs the command in a sandbox made from `parent`; on success the builder
 * snapshots the sandbox's root into a pending layer (before the sandbox is destroyed), takes
 * away what the runtime itself put there, and publishes it under the step's key.
 */
async function runStep(step: PlannedStep, parent: string, key: string, options: ExecuteOptions): Promise<void> {
  const where = `${options.file}:${step.line}`;
  if (!options.stepRunner) {
    throw new SandboxError('UNIMPLEMENTED', `${where}: RUN steps need Capsule's template runtime, which this build was not given`, {
      details: { step: step.step, line: step.line },
      hint: 'Build with a server or CLI whose engine runs sandboxes from templates, or remove the RUN step.',
    });
  }
  const run = step.run!;
  const parentRoot = options.layers.rootOf(parent);
  // A tenant's step writes no more than its quota has room for (its layer is charged that).
  const limits = { ...DEFAULT_STEP_LIMITS, ...options.limits };
  const room = options.layers.room(MIN_STEP_DISK_BYTES);
  const quotaBound = room !== undefined && room < limits.diskBytes;
  if (quotaBound) limits.diskBytes = Math.max(MIN_STEP_DISK_BYTES, Math.floor(room / MIN_STEP_DISK_BYTES) * MIN_STEP_DISK_BYTES);
  let pending: PendingLayer | undefined;
  // The command's own last lines (not the builder's), for a failure's message.
  const output: string[] = [];
  try {
    const result = await options.stepRunner.run(
      { layerDir: parentRoot, argv: run.argv, env: run.env, cwd: run.cwd, user: run.user, network: options.network, limits },
      {
        onLog: (line, stream) => {
          options.log.write(stream === 'stderr' ? 'warn' : 'info', step.step, line);
          if (output.push(line) > LAST_LINES) output.shift();
        },
        signal: options.signal,
        keep: async (rootDir) => {
          pending = await options.layers.createFromDir(rootDir);
          await removeRuntimeMarks(pending.root, parentRoot);
        },
      },
    );
    if (quotaBound && result.outcome === 'limit_exceeded' && result.limit?.resource === 'disk') throw quotaHit(step, where, limits.diskBytes);
    if (result.outcome !== 'ok' || result.exitCode !== 0) throw stepFailed(step, where, result, output);
    if (!pending) throw new SandboxError('INTERNAL', `${where}: the step runner did not hand back the step's root`);
    await publishStep(pending, step, key, parent, options);
  } catch (error) {
    if (pending) await options.layers.discard(pending);
    throw error;
  }
}

/**
 * What a sandbox's runtime adds to its root and a layer must not keep: mount points it made
 * (/workspace, /.capsule, /etc/resolv.conf and the kernel views) where the parent had nothing.
 * Only empty ones go: what a step itself wrote there stays.
 */
const RUNTIME_PATHS = ['workspace', '.capsule', 'etc/resolv.conf', 'proc', 'sys', 'dev/shm', 'dev', 'tmp'];

async function removeRuntimeMarks(root: string, parentRoot: string): Promise<void> {
  for (const path of RUNTIME_PATHS) {
    if (await lstat(join(parentRoot, path)).then(() => true, () => false)) continue;
    const info = await lstat(join(root, path)).catch(() => undefined);
    if (!info) continue;
    if (info.isDirectory() && (await readdir(join(root, path))).length === 0) await rmdir(join(root, path));
    else if (info.isFile() && info.size === 0) await unlink(join(root, path));
  }
}

const LAST_LINES = 10;
const MIN_STEP_DISK_BYTES = 1024 * 1024;

/** A RUN stopped at the disk its tenant's quota had left. */
function quotaHit(step: PlannedStep, where: string, diskBytes: number): SandboxError {
  return new SandboxError('QUOTA_EXCEEDED', `${where}: RUN wrote past the ${Math.floor(diskBytes / MIN_STEP_DISK_BYTES)} MiB its tenant's disk quota had left`, {
    details: { resource: 'disk', for: 'templates', step: step.step, line: step.line, limit: diskBytes },
    hint: 'Free disk (delete snapshots, volumes, templates or artifacts you no longer need, or kill sandboxes), or ask the operator for a larger quota; then build again.',
  });
}

function stepFailed(step: PlannedStep, where: string, result: StepResult, lastLines: readonly string[]): SandboxError {
  const why =
    result.outcome === 'limit_exceeded'
      ? `stopped by the ${result.limit?.resource ?? ''} limit`
      : result.outcome === 'error'
        ? `could not run: ${result.error?.message ?? result.diagnostic ?? 'the sandbox failed'}`
        : `failed with exit code ${result.exitCode ?? result.signal}`;
  return new SandboxError('BUILD_FAILED', `${where}: RUN ${why}${lastLines.length > 0 ? `: ${lastLines.at(-1)}` : ''}`, {
    details: { step: step.step, line: step.line, exitCode: result.exitCode, outcome: result.outcome, lastLines: [...lastLines] },
    hint: 'Fix the command (the last lines of its output are in details.lastLines and the build log), then build again: the steps before it come from the cache.',
  });
}
