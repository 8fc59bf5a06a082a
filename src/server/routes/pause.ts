import { z } from 'zod';
import { defineRoute, type AnyRoute } from '../route.js';
import { ErrorBodySchema, SandboxIdParams, SandboxInfoSchema } from '../../wire/index.js';
import { requireSandbox, type ServerServices } from '../services.js';

const PauseBody = z.strictObject({
  keepMemory: z.boolean().optional().meta({ description: 'Keep processes and their memory (default true); false ends the processes and keeps files.' }),
});

/** A paused sandbox says what its pause kept, what its TTL does meanwhile and what resumes it. */
const PausedInfoSchema = SandboxInfoSchema;

const error = (description: string) => ({ description, schema: ErrorBodySchema });

/** `POST /v1/sandboxes/{id}/pause` and `/resume`. */
export function pauseRoutes(services: ServerServices): AnyRoute[] {
  const engine = services.engine;
  return [
    defineRoute({
      name: 'sandboxes.pause',
      method: 'POST',
      url: '/v1/sandboxes/:sandboxId/pause',
      summary: 'Pause a sandbox; `pause` in the answer says whether memory is kept and whether it survives a server restart',
      auth: 'tenant',
      params: SandboxIdParams,
      body: PauseBody.optional(),
      responses: {
        200: { description: 'The paused sandbox', schema: PausedInfoSchema },
        404: error('No such sandbox'),
        409: error('Already paused (CONFLICT) or not running'),
        422: error('The backend cannot pause this way (BACKEND_CANNOT_ENFORCE)'),
      },
      audit: ({ params }) => ({ sandboxId: params.sandboxId }),
      async handler({ params, body, principal }) {
        requireSandbox(services, principal.tenantId, params.sandboxId);
        const info = await engine.pause(principal.tenantId, params.sandboxId, { keepMemory: body?.keepMemory ?? true });
        return { kind: 'json', status: 200, body: info };
      },
    }),
    defineRoute({
      name: 'sandboxes.resume',
      method: 'POST',
      url: '/v1/sandboxes/:sandboxId/resume',
      summary: 'Continue a paused sandbox (a running one is left as it is)',
      auth: 'tenant',
      params: SandboxIdParams,
      responses: {
        200: { description: 'The running sandbox', schema: PausedInfoSchema },
        404: error('No such sandbox'),
        409: error('The sandbox has ended'),
      },
      audit: ({ params }) => ({ sandboxId: params.sandboxId }),
      async handler({ params, principal }) {
        requireSandbox(services, principal.tenantId, params.sandboxId);
        return { kind: 'json', status: 200, body: await engine.resume(principal.tenantId, params.sandboxId) };
      },
    }),
  ];
}
