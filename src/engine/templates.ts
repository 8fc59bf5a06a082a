import { SandboxError } from '../errors/index.js';
import { HOST_TEMPLATE } from '../sandbox-spec/index.js';
import { SANDBOX_UID, SANDBOX_USER } from '../host/sandbox-layout.js';

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

/**
 * The user a process starts as. A sandbox from a template runs its agent as root and starts each
 * process as the user named (its own default: the template's). The host template has one user,
 * uid 1000, and no root: asking for another is refused, never silently ignored.
 */
export function userFor(template: string | undefined, user: string | undefined): string | undefined {
  if (hasTemplateRoot(template)) return user ?? 'root';
  if (user === undefined || user === SANDBOX_USER || user === String(SANDBOX_UID)) return undefined;
  throw new SandboxError('BACKEND_CANNOT_ENFORCE', `the host template has one user, "${SANDBOX_USER}" (uid ${SANDBOX_UID}); it cannot run processes as "${user}"`, {
    details: { field: 'user', user, template: HOST_TEMPLATE },
    hint: 'Create the sandbox from a template (spec.template, e.g. "base") to run as root or another user.',
  });
}
