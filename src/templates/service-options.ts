import type { HostEnvironment } from '../host/host-env.host.js';
import type { NetworkPolicyInput } from '../sandbox-spec/index.js';
import type { OnLog } from './build-log.js';
import type { RunStep, StepRunner } from './builder/step-runner.js';
import type { Instruction } from './dockerfile/parse.js';
import type { TemplateConfig } from './records.js';
import type { TemplateBudget } from './build-budget.js';

/** What TemplateService and its builds take (template-service.ts). */
export interface TemplateServiceOptions {
  host: HostEnvironment;
  /** Runs RUN steps in sandboxes (the engine's); without it an uncached RUN fails with UNIMPLEMENTED. */
  stepRunner?: StepRunner;
  /** Layers under live sandboxes, which garbage collection keeps. @default () => false */
  isInUse?: (layerKey: string) => boolean;
  /** Registries the operator allows over plain HTTP besides loopback ones. @default [] */
  insecureRegistries?: string[];
  /**
   * Where tenants' builds are charged (the server's disk quota): each layer a tenant's build adds
   * is reserved before it is published. Operator builds (the public owner) are not. @default none
   */
  budget?: TemplateBudget;
  /** Builds one tenant may run at once (the public owner's are not bounded). @default 2 */
  maxConcurrentBuildsPerTenant?: number;
}

export interface JobOptions {
  /** Tenant id, or `_public` (the default) for an operator's template every tenant may use. */
  owner?: string;
  /** `name[:tag]` of the template to make; the tag defaults to `latest`. */
  name: string;
  /** More tags for the same template. */
  tags?: string[];
  onLog?: OnLog;
  signal?: AbortSignal;
  /** Overrides of the template's config (E2B's startCmd and readyCmd). */
  config?: Partial<TemplateConfig>;
  /** The building key's disk quota (the layers a tenant's build adds are charged under it). @default the operator's */
  quotaBytes?: number;
}

export interface BootstrapDebianOptions extends JobOptions {
  /** @default the host's suite (VERSION_CODENAME) */
  suite?: string;
  /** Packages beyond ca-certificates, curl, iproute2 and procps. */
  packages?: string[];
}

export interface ImportImageOptions extends JobOptions {
  /** `registry/name:tag`, `…@sha256:…`, `oci:/dir:tag`, `oci-archive:/file.tar`, `docker-archive:/file.tar`. */
  ref: string;
  /** Host paths (oci:, *-archive:) are the operator's: refused unless this is set. @default false */
  allowHostPaths?: boolean;
}

export interface BuildOptions extends JobOptions {
  /** The build context directory. */
  contextDir: string;
  /** The Dockerfile, relative to the context or absolute. @default 'Dockerfile' */
  dockerfile?: string;
  /** The Dockerfile's text, instead of a file. */
  dockerfileText?: string;
  /** Instructions already made, instead of a Dockerfile (`dockerfile` names them in messages). */
  instructions?: Instruction[];
  /** Who steps run as until a USER: `root` (Docker's rule) or the base's user (E2B's). @default 'root' */
  stepUser?: 'root' | 'base';
  buildArgs?: Record<string, string>;
  /** Skip the cache: every step makes a new layer. @default false */
  noCache?: boolean;
  /** RUN steps' network. @default the host's apt sources (allowlist) */
  network?: NetworkPolicyInput;
  limits?: Partial<RunStep['limits']>;
  allowHostPaths?: boolean;
}

export interface PruneReport {
  removedLayers: string[];
  /** Exclusive bytes of the removed layers. */
  freedLayerBytes: number;
  /** Bytes of image blobs no layer needs any more. */
  freedImageCacheBytes: number;
  /** Temps of dead processes: pending layers, build dirs, jobs' cgroups, records' temp files. */
  removedTemps: string[];
}

