import { HOST_TEMPLATE } from '../sandbox-spec/index.js';
import { HostEnvironment } from '../host/host-env.host.js';
import { isTemplateId, parseTemplateRef, TemplateService, type StepRunner, type TemplateBudget } from '../templates/index.js';
import { HOST_IMAGE, type TemplateCatalog, type TemplateImage } from './templates.js';

/**
 * The engine's template catalog over Capsule's template store: `spec.template` names a template
 * of the caller's tenant (or a public one) by `name[:tag]` or id, and sandboxes are made from its
 * top layer with its config as defaults. `host` stays the host's own /usr.
 */
export class StoredTemplates implements TemplateCatalog {
  constructor(
    private readonly templates: TemplateService,
    /** The template of specs that name none. @default 'host' */
    readonly defaultRef: string = HOST_TEMPLATE,
  ) {}

  async resolve(tenantId: string, ref: string): Promise<TemplateImage> {
    if (ref === HOST_TEMPLATE) return HOST_IMAGE;
    const record = await this.templates.resolve(tenantId, ref);
    const name = isTemplateId(ref) ? ref : (({ name: n, tag }) => `${n}:${tag}`)(parseTemplateRef(ref));
    const { env, workdir, user, startCmd, readyCmd } = record.config;
    return {
      ref: name,
      layerDir: this.templates.layers.rootOf(record.layer),
      env,
      workdir,
      user,
      ...(startCmd !== undefined ? { startCmd } : {}),
      ...(readyCmd !== undefined ? { readyCmd } : {}),
    };
  }
}

/**
 * A template service on a host prepared for an engine (the same volume its sandboxes' roots are
 * snapshots on): pass the host to `SandboxManager.open`, then give the service the engine's
 * `buildStepRunner()` through `stepRunner`, which is called only once a build runs a step.
 */
export function openTemplateHost(options: {
  dataDir: string;
  volumeBytes?: number;
  /** HostEnvironmentOptions.favorCgroupMigrations. @default true */
  favorCgroupMigrations?: boolean;
  stepRunner: StepRunner;
  /** Where tenants' builds are charged (TemplateServiceOptions.budget). */
  budget?: TemplateBudget;
  maxConcurrentBuildsPerTenant?: number;
}): { host: HostEnvironment; service: TemplateService } {
  const host = new HostEnvironment({ dataDir: options.dataDir, volumeBytes: options.volumeBytes, favorCgroupMigrations: options.favorCgroupMigrations });
  const bounds = {
    ...(options.budget ? { budget: options.budget } : {}),
    ...(options.maxConcurrentBuildsPerTenant !== undefined ? { maxConcurrentBuildsPerTenant: options.maxConcurrentBuildsPerTenant } : {}),
  };
  return { host, service: new TemplateService({ host, stepRunner: options.stepRunner, ...bounds }) };
}
