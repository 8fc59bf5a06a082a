/**
 * Capsule's TypeScript SDK (`capsule/sdk`): a client of `capsule serve` over HTTP. It loads no
 * engine, backend or host code and never spawns a process (test/unit/sdk-imports.test.ts checks).
 */
export { Sandbox, type CreateOptions, type ForkEntry, type ForkOutcome, type ListOptions } from './sandbox.js';
export { Snapshots } from './snapshots.js';
export { Volumes } from './volumes.js';
export { Contexts, type ContextInfo, type CreateContextOptions, type Execution, type ExecutionError, type InterpreterLanguage, type Result, type RunCodeOptions } from './code.js';
export { Commands, CommandHandle, type ConnectOptions, type OutputCallbacks, type RunOptions } from './commands.js';
export {
  Artifacts,
  type ArtifactCollection,
  type ArtifactRef,
  type CollectOptions,
  type DeliveredArtifact,
  type DownloadOptions,
  type SkippedArtifact,
  type StoredArtifact,
  type UsageSample,
} from './artifacts.js';
export { Files, type ReadFormat, type ReadOptions, type WatchHandle, type WatchOptions, type WriteData } from './files.js';
export { DEFAULT_REQUEST_TIMEOUT_MS, DEFAULT_URL, resolveConfig, type ConnectionOptions, type ResolvedConfig } from './config.js';
export * from './errors.js';
export type * from './types.js';
export { Template, type BuildLogEntry, type BuildOptions as TemplateBuildOptions, type BuildTemplateRequest, type TemplateBuildInfo, type TemplateInfo, type TemplateSource } from './templates.js';
