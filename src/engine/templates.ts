import { SandboxError } from '../errors/index.js';
import { HOST_TEMPLATE } from '../spec/index.js';

/**
 * What a sandbox is made from, as the engine needs it: the layer its root is a snapshot of, and
 * the defaults its processes start with. Resolved once at create; the spec then holds the result.
 */
export interface TemplateImage {
  /** The reference as resolved: `name:tag`, or `host`. */
  ref: string;
  /** The read-only layer a sandbox's root is a snapshot of; undefined for the host template. */
  layerDir?: string;
  /** Environment of every process (the spec's env goes on top). */
  env: Record<string, string>;
  /** Working directory of processes when the spec names none. */
  workdir?: string;
  /** The user processes run as when neither the spec nor the call names one. */
  user?: string;
  /** Started in the background when a sandbox is created (a shell command line). */
  startCmd?: string;
  /** Polled after `startCmd` until it exits 0: the create returns only then. */
  readyCmd?: string;
}

/** Where templates come from: the engine asks it once per create. */
export interface TemplateCatalog {
  /** The operator's default template, for specs that name none. */
  readonly defaultRef: string;
  /** The tenant's template (or an operator's public one); TEMPLATE_NOT_FOUND otherwise. */
  resolve(tenantId: string, ref: string): Promise<TemplateImage>;
}

/** The host template: the host's own /usr read-only, uid 1000, no root (sandboxes before templates). */
export const HOST_IMAGE: TemplateImage = { ref: HOST_TEMPLATE, env: {} };

/** A catalog with only the host template: the one-shot runner, and engines without a template store. */
export class HostOnlyCatalog implements TemplateCatalog {
  readonly defaultRef = HOST_TEMPLATE;

  resolve(_tenantId: string, ref: string): Promise<TemplateImage> {
    if (ref === HOST_TEMPLATE) return Promise.resolve(HOST_IMAGE);
    return Promise.reject(templateNotFound(ref));
  }
}

export function templateNotFound(ref: string): SandboxError {
  return new SandboxError('TEMPLATE_NOT_FOUND', `template ${ref} not found`, {
    details: { template: ref },
    hint: 'List the templates with `capsule template ls` (GET /v1/templates); build one with `capsule template build`, or use "host".',
  });
}

/** Whether sandboxes of this spec run from a template's root (root inside), not the host's /usr. */
export function hasTemplateRoot(template: string | undefined): boolean {
  return template !== undefined && template !== HOST_TEMPLATE;
}
