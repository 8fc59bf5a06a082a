import { join } from 'node:path';
import { chown, mkdir, stat } from 'node:fs/promises';
import { SandboxError } from '../errors/index.js';
import { parseSpec, type OperatorMaxima, type SandboxSpecInput } from '../sandbox-spec/index.js';
import type { Backend, BackendSandbox } from '../backends/backend.js';
import { createBackends } from '../backends/registry.js';
import { HostEnvironment, type HostEnvironmentOptions } from '../host/host-env.host.js';
import { copyOut, type CopyOutReport } from '../host/copy-out.host.js';
import { baseEnv } from '../host/sandbox-layout.js';
import { assertEnforceable } from './capabilities.js';
import { resolveMounts } from './mounts.js';
import { checkMountRoots } from '../host/mount-roots.host.js';
import { newSandboxId } from './ids.js';
import { withTemplate } from './template-start.js';
import { HostOnlyCatalog, userFor, type TemplateCatalog } from './templates.js';
import { WarmPool } from './warm-pool.js';
import { superviseExec, type SuperviseOptions } from './supervise.js';
import type { ArtifactRef, ExecResult } from '../wire/index.js';
// Reports (ajv) and artifacts (SQLite) are loaded by the runs that ask for them: a plain one-shot
// run (`capsule run`) starts without either.
import type { CollectOptions } from './artifacts.js';
import type { ReportError, ReportOptions } from './report.js';
import type { ArtifactStore } from '../store/artifacts/index.js';

export interface RunOptions extends Omit<SuperviseOptions, 'timeoutMs' | 'onStart'> {
  /** The sandbox spec; safe defaults fill what is left out. */
  spec?: SandboxSpecInput;
  /**
   * Host directory shown read-only at /input: the local user's own directory, made an ad-hoc
   * mount root named `input` for this run (checked like an operator's root).
   */
  inputDir?: string;
  /** Host directory that receives a copy of /workspace/output after the run. */
  outputDir?: string;
  /** Working directory inside the sandbox. @default spec.cwd */
  cwd?: string;
  /**
   * Collect the output directory into the artifact store after the run. Implied (with defaults)
   * by `outputDir`; `false` turns it off.
   */
  artifacts?: CollectOptions | false;
  /** Where the report is and the JSON Schema (draft 2020-12) it must satisfy. */
  report?: Omit<ReportOptions, 'schema'>;
  reportSchema?: object;
}

export interface RunResult extends ExecResult {
  sandboxId: string;
  /** What was copied from /workspace/output when `outputDir` was given. */
  output?: CopyOutReport;
  /** One reference per file of the output directory: delivered, or skipped and why. */
  artifacts?: ArtifactRef[];
  /** Files were left out by the total cap or the file-count cap. */
  artifactsTruncated?: boolean;
  /** The parsed (and, with `reportSchema`, validated) report. */
  report?: unknown;
  reportError?: ReportError;
}

export interface RunnerOptions extends HostEnvironmentOptions {
  maxima?: OperatorMaxima;
  /**
   * Sandboxes to keep started ahead of time for specs that can share them (no network, no mounts,
   * default start-time limits). Each is used once. @default 0
   */
  warmPool?: number;
  /**
   * Return each result as soon as it is known and tear the sandbox down behind it; `close()`
   * waits for every teardown. For long-lived callers that care about latency. @default false
   */
  deferTeardown?: boolean;
  /** Where collected artifacts go. @default a LocalArtifactStore at <dataDir>/artifacts, opened per run */
  artifactStore?: ArtifactStore;
  /**
   * Host directories specs may mount, by name (`spec.mounts[].root`). The one-shot runner is the
   * local user's own: every root is usable. @default none
   */
  mountRoots?: Readonly<Record<string, string>>;
  /** Where templates come from (spec.template). @default the host template only */
  templates?: TemplateCatalog;
  /**
   * Leave the workspace volume mounted at `close()` (the host stays prepared), so that the next
   * Runner in another process skips the mount. For `capsule run`, one Runner per process.
   * @default false: close() unmounts it when no workspace is left on it
   */
  keepVolumeMounted?: boolean;
}

/** The ad-hoc root `inputDir` becomes. */
export const INPUT_ROOT = 'input';

export const OUTPUT_DIR = '/workspace/output';

/**
 * One-shot execution: a fresh sandbox per command, destroyed before the result is returned (or
 * right after, with deferTeardown). Long-lived callers keep one Runner; `run()` makes one per call.
 */
export class Runner {
  readonly host: HostEnvironment;
  private readonly backends: Map<string, Backend>;
  private readonly maxima: OperatorMaxima | undefined;
  private readonly artifactStore: ArtifactStore | undefined;
  private readonly pool: WarmPool | undefined;
  private readonly deferTeardown: boolean;
  private readonly keepVolumeMounted: boolean;
  private readonly teardowns = new Set<Promise<void>>();
  private readonly mountRoots: Readonly<Record<string, string>>;
  private readonly templates: TemplateCatalog;

  constructor(options: RunnerOptions = {}) {
    this.deferTeardown = options.deferTeardown ?? false;
    this.mountRoots = options.mountRoots ?? {};
    this.templates = options.templates ?? new HostOnlyCatalog();
    this.keepVolumeMounted = options.keepVolumeMounted ?? false;
    this.host = new HostEnvironment(options);
    this.maxima = options.maxima;
    this.artifactStore = options.artifactStore;
    this.backends = new Map(createBackends(this.host).map((backend) => [backend.name, backend]));
    const namespace = this.backends.get('namespace');
    if (options.warmPool && namespace) {
      this.pool = new WarmPool({ backend: namespace, spec: parseSpec({}, this.maxima), size: options.warmPool });
    }
  }

  /** Releases the workspace volume when no sandbox of this data dir is left on it. */
  async close(): Promise<void> {
    await Promise.all([...this.teardowns]);
    await this.pool?.close();
    // Networked runs leave the egress proxy, its anchor and ready namespaces to their backend.
    for (const backend of this.backends.values()) await backend.close?.();
    if (!this.keepVolumeMounted) await this.host.volume.releaseIfIdle();
  }

  async run(command: readonly string[], options: RunOptions = {}): Promise<RunResult> {
    if (command.length === 0 || command.some((arg) => typeof arg !== 'string' || arg.includes('\0'))) {
      throw new SandboxError('INVALID_ARGUMENT', 'command must be a non-empty array of strings without NUL bytes', {
        details: { field: 'command' },
        hint: "Pass argv, e.g. ['python3', 'script.py']; for a shell use ['bash', '-c', script].",
      });
    }
    const input = { ...(options.spec ?? {}) };
    const roots: Record<string, string> = { ...this.mountRoots };
    if (options.inputDir !== undefined) {
      if (INPUT_ROOT in roots) {
        throw new SandboxError('INVALID_ARGUMENT', `inputDir is mounted as root "${INPUT_ROOT}", which mountRoots already names`, {
          details: { field: 'inputDir' },
          hint: `Rename the "${INPUT_ROOT}" mount root, or mount it through the spec instead of inputDir.`,
        });
      }
      roots[INPUT_ROOT] = options.inputDir;
      input.mounts = [...(input.mounts ?? []), { root: INPUT_ROOT, sandboxPath: '/input' }];
    }
    const image = await this.templates.resolve('local', input.template ?? this.templates.defaultRef);
    const spec = parseSpec(withTemplate(input, image), this.maxima);
    const collect = options.artifacts ?? (options.outputDir === undefined ? false : {});
    const wantsReport = collect !== false || options.reportSchema !== undefined || options.report !== undefined;
    const reports = wantsReport ? await import('./report.js') : undefined;
    const validate = options.reportSchema === undefined ? undefined : reports?.compileReportSchema(options.reportSchema);
    const artifacts = collect === false ? undefined : await import('./artifacts.js');
    if (collect !== false) artifacts?.checkCollectOptions(collect);
    const backend = this.backends.get(spec.backend);
    if (!backend) {
      throw new SandboxError('BACKEND_UNAVAILABLE', `backend ${spec.backend} is not configured on this host`, {
        details: { backend: spec.backend },
        hint: 'Use backend "namespace".',
      });
    }
    assertEnforceable(spec, await backend.probe());
    const mounts = spec.mounts.length === 0 ? [] : await resolveMounts(spec, 'all', await checkMountRoots(roots, [this.host.dataDir]), this.host.dataDir);

    const template = image.layerDir !== undefined ? { template: { layerDir: image.layerDir } } : {};
    const sandbox = (await this.pool?.take(spec)) ?? (await backend.create(spec, { id: newSandboxId(), signal: options.signal, mounts, ...template }));
    const sandboxId = sandbox.id;
    try {
      if (options.outputDir !== undefined || wantsReport) await prepareOutputDir(sandbox);
      const result = await superviseExec(
        sandbox,
        { argv: [...command], env: { ...baseEnv(spec.template), ...spec.env }, cwd: options.cwd ?? spec.cwd, ...userOption(spec.template, spec.user) },
        options,
      );
      let output: CopyOutReport | undefined;
      if (options.outputDir !== undefined || wantsReport) await sandbox.freeze(); // nothing may change the files while they are copied
      if (options.outputDir !== undefined) output = await copyOut(join(sandbox.workspaceDir, 'output'), options.outputDir);
      const collection =
        collect === false || !artifacts ? undefined : await this.withStore((store) => artifacts.collectArtifacts(sandbox, store, { ...collect, freeze: false }));
      const report = reports ? await reports.readReport(sandbox, { ...options.report, validate }) : {};
      return {
        sandboxId,
        ...result,
        ...(output ? { output } : {}),
        ...(collection ? { artifacts: collection.artifacts, artifactsTruncated: collection.truncated } : {}),
        ...report,
      };
    } finally {
      await this.teardown(sandbox);
    }
  }

  private async teardown(sandbox: BackendSandbox): Promise<void> {
    if (!this.deferTeardown) return sandbox.destroy();
    // Failures surface at close(): it awaits every teardown.
    const done: Promise<void> = sandbox.destroy().finally(() => this.teardowns.delete(done));
    this.teardowns.add(done);
  }

  private async withStore<T>(fn: (store: ArtifactStore) => Promise<T>): Promise<T> {
    if (this.artifactStore) return fn(this.artifactStore);
    const { LocalArtifactStore } = await import('../store/artifacts/index.js');
    const store = await LocalArtifactStore.open({ root: join(this.host.dataDir, 'artifacts') });
    try {
      return await fn(store);
    } finally {
      await store.close();
    }
  }
}

async function prepareOutputDir(sandbox: BackendSandbox): Promise<void> {
  const dir = join(sandbox.workspaceDir, 'output');
  await mkdir(dir, { recursive: true });
  const { uid } = await stat(sandbox.workspaceDir);
  await chown(dir, uid, uid);
}

/**
 * Runs one command in a fresh sandbox and returns how it ended. Convenient, not fast: it prepares
 * the host and releases the workspace volume each time; keep a Runner for many runs.
 */
export async function run(command: readonly string[], options: RunOptions & RunnerOptions = {}): Promise<RunResult> {
  const runner = new Runner(options);
  try {
    return await runner.run(command, options);
  } finally {
    await runner.close();
  }
}

/** The agent's `user` of a one-shot run: the template's, or none on the host template. */
function userOption(template: string | undefined, user: string | undefined): { user?: string } {
  const who = userFor(template, user);
  return who === undefined ? {} : { user: who };
}
