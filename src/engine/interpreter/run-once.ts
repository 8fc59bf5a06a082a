import { parseSpec, type OperatorMaxima, type SandboxSpecInput } from '../../sandbox-spec/index.js';
import { NamespaceBackend } from '../../backends/namespace/namespace-backend.host.js';
import { HostEnvironment } from '../../host/host-env.host.js';
import { SandboxError } from '../../errors/index.js';
import { assertEnforceable } from '../capabilities.js';
import { newSandboxId } from '../ids.js';
import { InterpreterService } from './service.js';
import type { RunCodeOptions } from './types.js';
import type { Execution, InterpreterLanguage } from '../../wire/index.js';

export interface RunCodeOnceOptions extends Omit<RunCodeOptions, 'contextId'> {
  /** @default 'python' */
  language?: InterpreterLanguage;
  /** The sandbox spec; safe defaults fill what is left out. */
  spec?: SandboxSpecInput;
  /** Capsule's data directory. @default '/var/lib/capsule' */
  dataDir?: string;
  maxima?: OperatorMaxima;
}

export interface RunCodeOnceResult extends Execution {
  sandboxId: string;
  language: InterpreterLanguage;
}

/** Runs code in a fresh context of a fresh sandbox, then destroys both. */
export async function runCodeOnce(code: string, options: RunCodeOnceOptions = {}): Promise<RunCodeOnceResult> {
  const spec = parseSpec(options.spec ?? {}, options.maxima);
  if (spec.backend !== 'namespace') {
    throw new SandboxError('BACKEND_UNAVAILABLE', `backend ${spec.backend} is not configured for run-code on this host`, {
      details: { backend: spec.backend },
      hint: 'Use backend "namespace".',
    });
  }
  const backend = new NamespaceBackend({ host: new HostEnvironment({ dataDir: options.dataDir }) });
  assertEnforceable(spec, await backend.probe());
  const language = options.language ?? 'python';
  const sandboxId = newSandboxId();
  const sandbox = await backend.create(spec, { id: sandboxId, signal: options.signal });
  const interpreters = new InterpreterService(sandbox);
  try {
    const context = await interpreters.createContext({ language, signal: options.signal });
    const execution = await interpreters.runCode(code, { ...options, contextId: context.id, language });
    return { sandboxId, language, ...execution };
  } finally {
    await interpreters.close().finally(() => sandbox.destroy());
  }
}
