import { SandboxError } from '../errors/index.js';
import type { Backend } from '../backends/backend.js';
import { createBackends } from '../backends/registry.js';
import type { HostEnvironment } from '../host/host-env.host.js';
import { baseEnv } from '../host/sandbox-layout.js';
import { parseSpec, type BackendName, type OperatorMaxima } from '../sandbox-spec/index.js';
import type { RunStep, RunStepOptions, StepResult, StepRunner } from '../templates/index.js';
import { assertEnforceable } from './capabilities.js';
import { newSandboxId } from './ids.js';
import { superviseExec } from './supervise.js';

/** The template name build steps' specs carry: a template root, never the host's /usr. */
export const BUILD_STEP_TEMPLATE = 'build-step';

export interface SandboxStepRunnerOptions {
  host: HostEnvironment;
  /** The backend RUN steps run on. @default 'namespace' */
  backend?: BackendName;
  /** Backends to use instead of making them (a server passes its own). */
  backends?: readonly Backend[];
  maxima?: OperatorMaxima;
}

/**
 * Runs Dockerfile RUN steps in Capsule sandboxes: each step is a fresh sandbox made from the
 * parent layer like any sandbox from a template (a private copy-on-write root, root inside a user
 * namespace of its own mapping 65,536 ids, seccomp, cgroup limits), as the step's user (`root`
 * by default), with the build's network grant (by default the host's apt sources and nothing
 * else). When the command exits 0 the sandbox is frozen and its root handed to the builder, which
 * snapshots it into the step's layer; the sandbox is destroyed in every case.
 */
export class SandboxStepRunner implements StepRunner {
  private readonly backends: Map<string, Backend>;
  private readonly owned: boolean;

  constructor(private readonly options: SandboxStepRunnerOptions) {
    this.owned = options.backends === undefined;
    this.backends = new Map((options.backends ?? createBackends(options.host)).map((backend) => [backend.name, backend]));
  }

  async run(step: RunStep, options: RunStepOptions): Promise<StepResult> {
    const spec = parseSpec(
      { backend: this.options.backend ?? 'namespace', template: BUILD_STEP_TEMPLATE, user: step.user, limits: step.limits, network: step.network, env: step.env, cwd: step.cwd },
      this.options.maxima,
    );
    const backend = this.backends.get(spec.backend);
    if (!backend) throw new SandboxError('BACKEND_UNAVAILABLE', `backend ${spec.backend} is not configured on this host`, { details: { backend: spec.backend } });
    assertEnforceable(spec, await backend.probe());
    const sandbox = await backend.create(spec, { id: newSandboxId(), signal: options.signal, template: { layerDir: step.layerDir } });
    const stdout = new LineSplitter((line) => options.onLog(line, 'stdout'));
    const stderr = new LineSplitter((line) => options.onLog(line, 'stderr'));
    try {
      const result = await superviseExec(
        sandbox,
        { argv: step.argv, env: { ...baseEnv(spec.template), ...step.env }, cwd: step.cwd, user: step.user },
        { onStdout: (chunk) => stdout.push(chunk), onStderr: (chunk) => stderr.push(chunk), signal: options.signal, timeoutMs: spec.limits.wallClockMs },
      );
      stdout.flush();
      stderr.flush();
      if (options.signal?.aborted) throw new SandboxError('ABORTED', 'the build step was cancelled');
      if (result.outcome === 'ok' && result.exitCode === 0) {
        // Nothing the step left running may change the root while it is snapshotted.
        await sandbox.freeze();
        await options.keep(this.options.host.volume.rootPath(sandbox.id));
      }
      return result;
    } finally {
      await sandbox.destroy();
    }
  }

  /** Closes the backends it made (their egress proxies and network pools). */
  async close(): Promise<void> {
    if (!this.owned) return;
    for (const backend of this.backends.values()) await backend.close?.();
  }
}

/** Splits a byte stream into lines; a partial last line waits for the next chunk or flush(). */
class LineSplitter {
  private rest = '';

  constructor(private readonly onLine: (line: string) => void) {}

  push(chunk: Buffer): void {
    const parts = (this.rest + chunk.toString('utf8')).split(/\r?\n/);
    this.rest = parts.pop() ?? '';
    if (this.rest.length > 4096) {
      parts.push(this.rest);
      this.rest = '';
    }
    for (const line of parts) if (line !== '') this.onLine(line);
  }

  flush(): void {
    if (this.rest !== '') this.onLine(this.rest);
    this.rest = '';
  }
}
