export { run, Runner, type RunOptions, type RunResult, type RunnerOptions } from './engine/runner.js';
export type { ExecResult, LimitHit, LimitResource, Outcome, Usage, Warning } from './engine/result.js';
export * from './spec/index.js';
export * from './errors/index.js';
