export { run, Runner, type RunOptions, type RunResult, type RunnerOptions } from './engine/runner.js';
export type { ExecResult, LimitHit, LimitResource, Outcome, Usage, Warning } from './wire/index.js';
export * from './sandbox-spec/index.js';
export * from './errors/index.js';
export { InterpreterService, runCodeOnce, type RunCodeOnceOptions, type RunCodeOnceResult } from './engine/interpreter/index.js';
export { SandboxManager, type SandboxManagerOptions } from './engine/sandbox-manager.js';
export { MemoryRecordStore, type SandboxRecordStore } from './store/index.js';
export { createBackends } from './backends/registry.js';
