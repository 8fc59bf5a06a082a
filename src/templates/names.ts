import { SandboxError } from '../errors/index.js';
import { TENANT_ID_PATTERN } from '../wire/operators.js';

/** Templates an operator made for every tenant. Not a valid tenant id (those start with [a-z0-9]). */
export const PUBLIC_OWNER = '_public';

export const DEFAULT_TAG = 'latest';
const NAME = /^[a-z0-9][a-z0-9._-]{0,62}$/;
const TAG = /^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$/;
const TEMPLATE_ID = /^[0-9a-f]{20}$/;

export interface TemplateRef {
  name: string;
  tag: string;
  /** True when the text named the tag (`name:tag`), false when `latest` was assumed. */
  tagged: boolean;
}

/** Parses `name[:tag]`; the tag defaults to `latest`. Bad input is INVALID_ARGUMENT naming the rule. */
export function parseTemplateRef(text: string): TemplateRef {
  const colon = text.lastIndexOf(':');
  const name = colon < 0 ? text : text.slice(0, colon);
  const tag = colon < 0 ? DEFAULT_TAG : text.slice(colon + 1);
  if (!NAME.test(name)) {
    throw new SandboxError('INVALID_ARGUMENT', `"${text}" is not a template name: use lowercase letters, digits, ".", "_" and "-" (at most 63), starting with a letter or digit`, {
      details: { field: 'name', value: text },
    });
  }
  if (!TAG.test(tag)) {
    throw new SandboxError('INVALID_ARGUMENT', `"${tag}" is not a template tag: use letters, digits, ".", "_" and "-" (at most 128), not starting with "." or "-"`, {
      details: { field: 'tag', value: tag },
    });
  }
  return { name, tag, tagged: colon >= 0 };
}

export function isTemplateName(text: string): boolean {
  return NAME.test(text);
}

export function isTemplateId(text: string): boolean {
  return TEMPLATE_ID.test(text);
}

/** A tenant id or PUBLIC_OWNER; anything else is a programming error, never a path to follow. */
export function checkOwner(owner: string): string {
  if (owner !== PUBLIC_OWNER && !TENANT_ID_PATTERN.test(owner)) {
    throw new SandboxError('INVALID_ARGUMENT', `"${owner}" is not a tenant id`, { details: { field: 'owner' } });
  }
  return owner;
}

export function templateNotFound(ref: string): SandboxError {
  return new SandboxError('TEMPLATE_NOT_FOUND', `no template named "${ref}"`, {
    details: { template: ref },
    hint: 'List the templates you can use with `capsule template ls`; build one with `capsule template build` or `capsule template bootstrap debian`.',
  });
}
