/**
 * Templates: read-only root filesystems as content-addressed btrfs layers, their records, and the
 * ways to make them (a Debian bootstrap, an OCI image import, a Dockerfile build). See
 * docs/decisions/011-template-storage.md.
 */
export { DEFAULT_MAX_BUILDS_PER_TENANT, TemplateService, type TemplateBudget, type BootstrapDebianOptions, type BuildOptions, type ImportImageOptions, type PruneReport, type TemplateServiceOptions } from './template-service.js';
export { checkBuildRequest, TemplateSourceSpecSchema, type TemplateBuildRequest, type TemplateSourceSpec } from './build-request.js';
export { LayerStore, type LayerInfo, type LayerMeta, type PendingLayer } from './layer-store.host.js';
export { TemplateStore } from './template-store.js';
export { RegistryCredentials } from './oci/registry-credentials.js';
export { parseDockerfile, type Instruction } from './dockerfile/parse.js';
export { isTemplateId, parseTemplateRef, PUBLIC_OWNER, DEFAULT_TAG } from './names.js';
export { DEFAULT_STEP_LIMITS, type RunStep, type RunStepOptions, type StepResult, type StepRunner } from './builder/step-runner.js';
export type { BuildRecord, TemplateConfig, TemplateParent, TemplateRecord } from './records.js';
export type { LogEntry, OnLog } from './build-log.js';
export { unpackContextTar, type ContextTarLimits } from './dockerfile/context-tar.js';
