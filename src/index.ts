export { run, Runner, type RunOptions, type RunResult, type RunnerOptions } from './engine/runner.js';
export type { ExecResult, LimitHit, LimitResource, Outcome, Usage, Warning } from './engine/result.js';
export * from './spec/index.js';
export * from './errors/index.js';
export { InterpreterService, runCodeOnce, type RunCodeOnceOptions, type RunCodeOnceResult } from './engine/interpreter/index.js';
export { SandboxManager, MemoryRecordStore, type SandboxRecordStore, type SandboxManagerOptions } from './engine/sandbox-manager.js';
export { createBackends } from './backends/registry.js';
