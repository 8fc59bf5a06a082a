import type { Readable } from 'node:stream';
import { z } from 'zod';
import { SandboxError, isSandboxError } from '../../errors/index.js';
import type { ProcessEvent } from '../../engine/types.js';
import { defineRoute, type AnyRoute } from '../route.js';
import { ErrorBodySchema, ProcessEventSchema, ProcessInfoSchema, ProcessParams, SandboxIdParams, SignalBody, StartProcessBody } from '../../wire/index.js';
import { requireSandbox, type ServerServices } from '../services.js';
import type { Principal } from '../auth.js';
import { checkCollectOptions } from '../../engine/artifacts.js';
import { collectFor } from './artifacts.js';

/** The artifacts of a foreground exec; a failed collection is reported beside the exec's result. */
async function collectAfterExit(services: ServerServices, principal: Principal, sandboxId: string, dir: string | undefined): Promise<object> {
  try {
    const { artifacts, truncated } = await collectFor(services, principal, sandboxId, { dir });
    return { artifacts, artifactsTruncated: truncated };
  } catch (error) {
    const wire = error instanceof SandboxError ? error : new SandboxError('INTERNAL', (error as Error).message);
    return { artifacts: [], artifactsError: { code: wire.code, message: wire.message } };
  }
}

/** Bytes one stdin request may carry (the agent buffers what the process has not read yet). */
export const MAX_STDIN_BYTES = 8 * 1024 * 1024;

const error = (description: string) => ({ description, schema: ErrorBodySchema });
const NDJSON = { description: 'NDJSON ProcessEvents, ending with exit', schema: ProcessEventSchema, contentType: 'application/x-ndjson' };

/** A process event as a wire line: output bytes as base64. */
export function wireEvent(event: ProcessEvent): object {
  if (event.type === 'stdout' || event.type === 'stderr') return { type: event.type, data: event.data.toString('base64') };
  return event;
}

async function* wireEvents(events: AsyncIterable<ProcessEvent>): AsyncGenerator<object> {
  for await (const event of events) yield wireEvent(event);
}

export function processRoutes(services: ServerServices): AnyRoute[] {
  const { engine } = services;
  return [
    defineRoute({
      name: 'processes.start',
      wakes: true,
      method: 'POST',
      url: '/v1/sandboxes/:sandboxId/processes',
      summary: 'Start a process: foreground streams its events; background returns its pid',
      auth: 'tenant',
      params: SandboxIdParams,
      body: StartProcessBody,
      responses: {
        200: NDJSON,
        201: { description: 'Started in the background', schema: z.object({ pid: z.number().int() }) },
        409: error('The sandbox is not running'),
        422: error('The program could not be started (EXEC_FAILED)'),
        429: error("The tenant's disk quota has no room for the process's log (QUOTA_EXCEEDED)"),
      },
      audit: ({ params, body }) => ({ sandboxId: params.sandboxId, subject: JSON.stringify(body.argv) }),
      async handler({ params, body, principal, signal }) {
        requireSandbox(services, principal.tenantId, params.sandboxId);
        const { background, collectArtifacts, ...command } = body;
        if (collectArtifacts) checkCollectOptions(collectArtifacts);
        const handle = await engine.startProcess(principal.tenantId, params.sandboxId, command);
        if (background === true) return { kind: 'json', status: 201, body: { pid: handle.pid } };
        // The process outlives a client that goes away (docs/decisions/002): it can reattach by pid.
        return {
          kind: 'ndjson',
          status: 200,
          events: wireEvents(handle.events(signal)),
          final: handle.result.then(async (result) => ({
            type: 'exit',
            result: collectArtifacts ? { ...result, ...(await collectAfterExit(services, principal, params.sandboxId, collectArtifacts.dir)) } : result,
          })),
        };
      },
    }),
    defineRoute({
      name: 'processes.list',
      method: 'GET',
      url: '/v1/sandboxes/:sandboxId/processes',
      summary: 'List the processes of a sandbox (running and recently ended)',
      auth: 'tenant',
      params: SandboxIdParams,
      responses: { 200: { description: 'Processes', schema: z.object({ processes: z.array(ProcessInfoSchema) }) } },
      handler({ params, principal }) {
        const record = requireSandbox(services, principal.tenantId, params.sandboxId);
        try {
          return { kind: 'json', status: 200, body: { processes: engine.listProcesses(principal.tenantId, params.sandboxId) } };
        } catch (error) {
          // Ended before a restart: its processes are gone with the old server.
          if (isSandboxError(error, 'SANDBOX_NOT_FOUND') && record.endedAt !== undefined) return { kind: 'json', status: 200, body: { processes: [] } };
          throw error;
        }
      },
    }),
    defineRoute({
      name: 'processes.events',
      method: 'GET',
      url: '/v1/sandboxes/:sandboxId/processes/:pid/events',
      summary: 'Reattach: every event from the start, then live ones, ending with exit',
      auth: 'tenant',
      params: ProcessParams,
      responses: { 200: NDJSON, 404: error('No such process') },
      handler({ params, principal, signal }) {
        requireSandbox(services, principal.tenantId, params.sandboxId);
        const handle = engine.getProcess(principal.tenantId, params.sandboxId, params.pid);
        return { kind: 'ndjson', status: 200, events: wireEvents(handle.events(signal)) };
      },
    }),
    defineRoute({
      name: 'processes.stdin',
      wakes: true,
      method: 'POST',
      url: '/v1/sandboxes/:sandboxId/processes/:pid/stdin',
      summary: 'Write raw bytes to the stdin of a process started with stdin: true',
      auth: 'tenant',
      params: ProcessParams,
      rawBody: true,
      responses: { 204: { description: 'Written' }, 404: error('No such process, or it has ended'), 413: error('More than 8 MiB in one request') },
      audit: ({ params }) => ({ sandboxId: params.sandboxId }),
      async handler({ params, principal, body }) {
        requireSandbox(services, principal.tenantId, params.sandboxId);
        const handle = engine.getProcess(principal.tenantId, params.sandboxId, params.pid);
        let written = 0;
        for await (const chunk of body as Readable) {
          const data = chunk as Buffer;
          written += data.length;
          if (written > MAX_STDIN_BYTES) {
            throw new SandboxError('PAYLOAD_TOO_LARGE', `one stdin request may carry at most ${MAX_STDIN_BYTES} bytes`, {
              details: { field: 'body', limitBytes: MAX_STDIN_BYTES },
              hint: 'Split the input over several requests.',
            });
          }
          handle.writeStdin(data);
        }
        return { kind: 'empty', status: 204 };
      },
    }),
    defineRoute({
      name: 'processes.closeStdin',
      wakes: true,
      method: 'POST',
      url: '/v1/sandboxes/:sandboxId/processes/:pid/stdin/close',
      summary: 'Close the stdin of a process (it reads end of file)',
      auth: 'tenant',
      params: ProcessParams,
      responses: { 204: { description: 'Closed' }, 404: error('No such process, or it has ended') },
      audit: ({ params }) => ({ sandboxId: params.sandboxId }),
      handler({ params, principal }) {
        requireSandbox(services, principal.tenantId, params.sandboxId);
        engine.getProcess(principal.tenantId, params.sandboxId, params.pid).closeStdin();
        return { kind: 'empty', status: 204 };
      },
    }),
    defineRoute({
      name: 'processes.signal',
      wakes: true,
      method: 'POST',
      url: '/v1/sandboxes/:sandboxId/processes/:pid/signal',
      summary: 'Send a signal to a process',
      auth: 'tenant',
      params: ProcessParams,
      body: SignalBody,
      responses: { 204: { description: 'Sent' }, 404: error('No such process, or it has ended') },
      audit: ({ params, body }) => ({ sandboxId: params.sandboxId, subject: body.signal }),
      handler({ params, principal, body }) {
        requireSandbox(services, principal.tenantId, params.sandboxId);
        engine.getProcess(principal.tenantId, params.sandboxId, params.pid).signal(body.signal);
        return { kind: 'empty', status: 204 };
      },
    }),
  ];
}
