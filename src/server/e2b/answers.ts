import { SandboxError } from '../../errors/index.js';
import type { SandboxEngine } from '../../engine/types.js';
import { isLiveState, type SandboxInfo } from '../../wire/index.js';
import { ENVD_VERSION, type E2bContext } from './deps.js';

/** Where the template name is kept in the engine's metadata; never shown to E2B clients. */
export const TEMPLATE_KEY = 'capsule.e2b.template';

/** The tenant's sandbox if it is live; ended ones are gone as far as E2B clients know. */
export function liveSandbox(engine: SandboxEngine, tenantId: string, sandboxId: string): SandboxInfo {
  const info = engine.get(tenantId, sandboxId);
  if (!isLiveState(info.state)) {
    throw new SandboxError('SANDBOX_NOT_FOUND', `sandbox ${sandboxId} not found (it is ${info.state})`, {
      details: { sandboxId },
      hint: 'Create a new sandbox.',
    });
  }
  return info;
}

/** E2B's `Sandbox` answer (create, connect, each fork): ids, envd version and access tokens. */
export function sandboxBody(ctx: E2bContext, info: SandboxInfo) {
  const templateID = info.metadata[TEMPLATE_KEY] ?? 'base';
  return {
    templateID,
    sandboxID: info.sandboxId,
    clientID: 'capsule',
    envdVersion: ENVD_VERSION,
    envdAccessToken: ctx.tokens.issue(info.tenantId, info.sandboxId),
    // Sent back by the code-interpreter SDK on /contexts, which carries no other credential.
    trafficAccessToken: ctx.tokens.issue(info.tenantId, info.sandboxId),
    domain: ctx.publicDomain ?? null,
    alias: templateID,
  };
}

/** An option of E2B's the facade cannot honour: refused by name, never ignored. */
export function unsupported(field: string, why: string, hint = 'Remove the option; docs/e2b-compatibility.md lists what is supported.'): SandboxError {
  return new SandboxError('INVALID_ARGUMENT', `${field} is not supported by Capsule's E2B facade: ${why}`, {
    details: { field },
    hint,
  });
}
