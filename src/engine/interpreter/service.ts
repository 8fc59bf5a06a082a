import { randomBytes } from 'node:crypto';
import { SandboxError } from '../../errors/index.js';
import type { BackendSandbox } from '../../backends/backend.js';
import { baseEnv } from '../../host/sandbox-layout.js';
import { InterpreterContext } from './context.js';
import { DriverProcess, parseDriverLabel } from './driver.js';
import type { AgentProcess } from '../../backends/agent/index.js';
import { TypeStripper } from './typescript.js';
import { type CreateContextOptions, type RunCodeOptions } from './types.js';
import { INTERPRETER_LANGUAGES, type ContextInfo, type Execution, type InterpreterLanguage } from '../../wire/index.js';

const ID_PREFIX: Record<InterpreterLanguage, string> = { python: 'py', js: 'js', ts: 'ts' };

/**
 * Stateful code interpreter contexts of one live sandbox. Each context is a driver process
 * inside the sandbox (an IPython kernel, or a Node REPL context), so its code runs under the
 * sandbox's limits; the host only passes messages.
 */
export class InterpreterService {
  private readonly contexts = new Map<string, InterpreterContext>();
  /** The context `runCode` uses per language when it gets no contextId. */
  private readonly defaults = new Map<InterpreterLanguage, Promise<InterpreterContext>>();
  private readonly stripper = new TypeStripper();
  private isClosed = false;

  constructor(private readonly sandbox: BackendSandbox) {}

  /**
   * Adopts the contexts whose drivers an earlier server started in this sandbox (processes a
   * reattach took over, known by their label): same ids, same interpreter state, defaults kept.
   * Returns the processes adopted as drivers; the rest are ordinary processes.
   */
  adopt(processes: readonly AgentProcess[]): Set<AgentProcess> {
    const adopted = new Set<AgentProcess>();
    for (const process of processes) {
      const meta = parseDriverLabel(process.label);
      if (meta === undefined || this.contexts.has(meta.contextId)) continue;
      const context = new InterpreterContext({
        sandbox: this.sandbox,
        info: { id: meta.contextId, language: meta.language, cwd: meta.cwd },
        env: { ...baseEnv(), ...this.sandbox.spec.env, ...meta.envVars },
        stripper: this.stripper,
        isDefault: meta.isDefault,
        ...(meta.envVars ? { envVars: meta.envVars } : {}),
      });
      context.adopt(DriverProcess.adopt(process, meta.language));
      this.contexts.set(meta.contextId, context);
      if (meta.isDefault) this.defaults.set(meta.language, Promise.resolve(context));
      adopted.add(process);
    }
    return adopted;
  }

  async createContext(options: CreateContextOptions = {}): Promise<ContextInfo> {
    return (await this.newContext(options)).info;
  }

  listContexts(): ContextInfo[] {
    return [...this.contexts.values()].map((context) => ({ ...context.info }));
  }

  async restartContext(contextId: string, options: { timeoutMs?: number; signal?: AbortSignal } = {}): Promise<void> {
    await this.get(contextId).restart(options);
  }

  async deleteContext(contextId: string): Promise<void> {
    const context = this.get(contextId);
    this.contexts.delete(contextId);
    for (const [language, pending] of this.defaults) {
      if ((await pending.catch(() => undefined)) === context) this.defaults.delete(language);
    }
    await context.close();
  }

  /** Runs code in a context: `contextId`'s, or the default context of `language` (python). */
  async runCode(code: string, options: RunCodeOptions = {}): Promise<Execution> {
    if (typeof code !== 'string') {
      throw new SandboxError('INVALID_ARGUMENT', 'code must be a string', { details: { field: 'code' } });
    }
    checkEnv(options.envVars);
    const context = options.contextId !== undefined ? this.get(options.contextId) : await this.defaultContext(options.language ?? 'python', options.signal);
    if (options.language !== undefined && options.contextId !== undefined && options.language !== context.info.language) {
      throw new SandboxError('INVALID_ARGUMENT', `context ${context.info.id} runs ${context.info.language}, not ${options.language}`, {
        details: { contextId: context.info.id, language: options.language },
        hint: 'Pass either contextId or language, or a context of that language.',
      });
    }
    return context.run(code, options);
  }

  /** Shuts every context down. */
  async close(): Promise<void> {
    this.isClosed = true;
    const all = [...this.contexts.values()];
    this.contexts.clear();
    this.defaults.clear();
    await Promise.all(all.map((context) => context.close()));
  }

  private defaultContext(language: InterpreterLanguage, signal?: AbortSignal): Promise<InterpreterContext> {
    let pending = this.defaults.get(language);
    if (pending === undefined) {
      pending = this.newContext({ language, signal }, true);
      this.defaults.set(language, pending);
      // A default that failed to start is tried again on the next call.
      pending.catch(() => this.defaults.get(language) === pending && this.defaults.delete(language));
    }
    return pending;
  }

  private async newContext(options: CreateContextOptions, isDefault = false): Promise<InterpreterContext> {
    if (this.isClosed) throw new SandboxError('SANDBOX_NOT_RUNNING', `the interpreters of sandbox ${this.sandbox.id} are shut down`);
    const language = options.language ?? 'python';
    if (!INTERPRETER_LANGUAGES.includes(language)) {
      throw new SandboxError('INVALID_ARGUMENT', `unknown language ${JSON.stringify(language)}`, {
        details: { field: 'language', allowed: INTERPRETER_LANGUAGES },
        hint: `Use one of ${INTERPRETER_LANGUAGES.join(', ')}.`,
      });
    }
    const cwd = options.cwd ?? this.sandbox.spec.cwd;
    if (!cwd.startsWith('/') || cwd.includes('\0')) {
      throw new SandboxError('INVALID_PATH', `cwd must be an absolute path inside the sandbox, got ${JSON.stringify(cwd)}`, {
        details: { field: 'cwd' },
      });
    }
    checkEnv(options.envVars);
    if (language === 'ts') this.stripper.preload();
    const id = `${ID_PREFIX[language]}-${randomBytes(6).toString('hex')}`;
    const context = new InterpreterContext({
      sandbox: this.sandbox,
      info: { id, language, cwd },
      env: { ...baseEnv(), ...this.sandbox.spec.env, ...options.envVars },
      stripper: this.stripper,
      isDefault,
      ...(options.envVars ? { envVars: options.envVars } : {}),
    });
    this.contexts.set(id, context);
    try {
      await context.start({ timeoutMs: options.timeoutMs, signal: options.signal });
    } catch (error) {
      this.contexts.delete(id);
      await context.close();
      throw error;
    }
    return context;
  }

  private get(contextId: string): InterpreterContext {
    const context = this.contexts.get(contextId);
    if (context === undefined) {
      throw new SandboxError('NOT_FOUND', `sandbox ${this.sandbox.id} has no interpreter context ${contextId}`, {
        details: { contextId },
        hint: 'List the contexts (listContexts) or create one (createContext).',
      });
    }
    return context;
  }
}

function checkEnv(env: Record<string, string> | undefined): void {
  for (const [key, value] of Object.entries(env ?? {})) {
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(key) || typeof value !== 'string' || value.includes('\0')) {
      throw new SandboxError('INVALID_ARGUMENT', `envVars: ${JSON.stringify(key)} is not a valid variable (name [A-Za-z_][A-Za-z0-9_]*, string value without NUL)`, {
        details: { field: 'envVars', key },
      });
    }
  }
}
