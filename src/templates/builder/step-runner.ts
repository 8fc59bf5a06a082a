import type { LimitsSchema, NetworkPolicyInput } from '../../sandbox-spec/index.js';
import type { ExecResult } from '../../wire/index.js';
import type { z } from 'zod';

/** One RUN step, as the builder hands it to the runtime. */
export interface RunStep {
  /**
   * The parent layer's read-only root (a subvolume on the workspace volume): the step's sandbox
   * is made from it as any sandbox from a template is, its root a private writable snapshot.
   */
  layerDir: string;
  argv: string[];
  /** The step's whole environment (the build's ENV and ARGs in effect). */
  env: Record<string, string>;
  /** Absolute, inside the root (the WORKDIR in effect; it exists). */
  cwd: string;
  /** `root` (uid 0 inside the sandbox's user namespace), a name or `uid[:gid]` of the template. */
  user: string;
  /** The build-time network grant: by default the host's apt sources and nothing else. */
  network: NetworkPolicyInput;
  limits: z.input<typeof LimitsSchema>;
}

export interface RunStepOptions {
  /** Every line the command writes, as it comes. */
  onLog: (line: string, stream: 'stdout' | 'stderr') => void;
  signal?: AbortSignal;
  /**
   * Called when the command exited 0, before the sandbox is destroyed, with its root (a writable
   * subvolume whose processes are frozen or gone): the builder snapshots it into the step's
   * layer. Not called when the command failed or was cancelled.
   */
  keep: (rootDir: string) => Promise<void>;
}

/** What the builder needs of a finished command; an ExecResult has all of it. */
export type StepResult = Pick<ExecResult, 'outcome' | 'exitCode' | 'signal'> & Partial<Pick<ExecResult, 'limit' | 'error' | 'diagnostic'>>;

/**
 * The seam between the builder and Capsule's runtime: runs one RUN step in a sandbox of its own
 * made from `layerDir`, as `user` (root inside its user namespace for uid 0), under `limits`,
 * with `network`; hands the root to `keep` when the command succeeded; resolves once the sandbox
 * is destroyed (nothing of it runs or is mounted any more). Cancelled by `signal`, it rejects
 * with ABORTED after the same. The engine implements it (src/engine/build-step-runner.ts);
 * without one, a build with an uncached RUN step fails with UNIMPLEMENTED.
 */
export interface StepRunner {
  run(step: RunStep, options: RunStepOptions): Promise<StepResult>;
}

const MiB = 1024 * 1024;

/** A RUN step's limits unless the build says otherwise: room for apt-get and compilers. */
export const DEFAULT_STEP_LIMITS = {
  cpus: 2,
  memoryBytes: 2048 * MiB,
  pids: 1024,
  wallClockMs: 30 * 60_000,
  diskBytes: 8192 * MiB,
  fileSizeBytes: 4096 * MiB,
  tmpBytes: 512 * MiB,
  stdoutBytes: MiB,
  stderrBytes: MiB,
} as const satisfies z.input<typeof LimitsSchema>;
