import { lstat } from 'node:fs/promises';
import { SandboxError } from '../../errors/index.js';
import type { NetworkPolicyInput } from '../../spec/index.js';
import type { BuildLog } from '../build-log.js';
import { hashParts } from '../keys.js';
import type { LayerStore, PendingLayer } from '../layer-store.host.js';
import { copyInto, makeDirInRoot } from '../rootfs/copy-into.host.js';
import { resolveInRoot } from '../rootfs/in-root.js';
import { resolveUserInRoot } from '../rootfs/users.js';
import type { BuildPlan, PlannedStep } from './plan.js';
import { DEFAULT_STEP_LIMITS, type RunStep, type StepRunner } from './step-runner.js';

export interface ExecuteOptions {
  plan: BuildPlan;
  layers: LayerStore;
  contextDir: string;
  log: BuildLog;
  /** Holds keys against garbage collection for the build; true for each that exists. */
  lease: (keys: string[]) => Promise<boolean[]>;
  stepRunner?: StepRunner;
  network: NetworkPolicyInput;
  limits?: RunStep['limits'];
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
    const pending = await layers.createFrom(layer);
    try {
      await applyStep(step, pending, options);
      options.signal?.throwIfAborted();
      await options.lease([key]);
      await layers.publish(pending, { key, parent: layer, source: 'step', description: `${options.file}:${step.line}: ${step.text}`.slice(0, 300) });
    } catch (error) {
      await layers.discard(pending);
      throw error;
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
    return;
  }
  if (step.run) await runStep(step, pending, options, where);
}

async function runStep(step: PlannedStep, pending: PendingLayer, options: ExecuteOptions, where: string): Promise<void> {
  if (!options.stepRunner) {
    throw new SandboxError('UNIMPLEMENTED', `${where}: RUN steps need Capsule's template runtime, which this build was not given`, {
      details: { step: step.step, line: step.line },
      hint: 'Build with a server or CLI whose engine runs sandboxes from templates, or remove the RUN step.',
    });
  }
  const run = step.run!;
  await makeDirInRoot(pending.root, run.cwd);
  const result = await options.stepRunner.run(
    { rootDir: pending.root, argv: run.argv, env: run.env, cwd: run.cwd, user: run.user, network: options.network, limits: options.limits ?? DEFAULT_STEP_LIMITS },
    { onLog: (line, stream) => options.log.write(stream === 'stderr' ? 'warn' : 'info', step.step, line), signal: options.signal },
  );
  if (result.outcome === 'ok' && result.exitCode === 0) return;
  const lastLines = options.log.lastLines(step.step, 10);
  const why =
    result.outcome === 'limit_exceeded'
      ? `stopped by the ${result.limit?.resource ?? ''} limit`
      : result.outcome === 'error'
        ? `could not run: ${result.error?.message ?? result.diagnostic ?? 'the sandbox failed'}`
        : `failed with exit code ${result.exitCode ?? result.signal}`;
  throw new SandboxError('BUILD_FAILED', `${where}: RUN ${why}${lastLines.length > 0 ? `: ${lastLines.at(-1)}` : ''}`, {
    details: { step: step.step, line: step.line, exitCode: result.exitCode, outcome: result.outcome, lastLines },
    hint: 'Fix the command (the last lines of its output are in details.lastLines and the build log), then build again: the steps before it come from the cache.',
  });
}
