import { z } from 'zod';
import type { InterpreterService } from '../../engine/interpreter/index.js';
import { SandboxError } from '../../errors/index.js';
import {
  CodeEventSchema,
  ContextInfoSchema,
  ContextParams,
  CreateContextBody,
  ErrorBodySchema,
  RunCodeBody,
  SandboxIdParams,
  type Execution,
} from '../../wire/index.js';
import { defineRoute, type AnyRoute, type RouteResult } from '../route.js';
import { requireSandbox, type ServerServices } from '../services.js';

/**
 * Interpreter contexts over HTTP: `POST /code` streams an execution's events as they happen;
 * `/contexts` creates, lists, restarts and deletes. The contexts are the engine's, shared with
 * the E2B facade's code interpreter.
 */

const error = (description: string) => ({ description, schema: ErrorBodySchema });

type Push = (event: object) => void;

/**
 * Events pushed by the run's callbacks, in order, then the seam's `exit` marker: the seam sends
 * `final` (the `end` event) in its place once the audit outcome and idempotent result are written.
 * A failed run ends the iteration with its error, which the seam sends as an error line.
 */
function streamRun(start: (push: Push) => Promise<Execution>): RouteResult {
  const queue: object[] = [];
  let wake: (() => void) | undefined;
  let isDone = false;
  const push: Push = (event) => {
    queue.push(event);
    wake?.();
  };
  const final = start(push).then((execution) => {
    if (execution.executionCount !== undefined) push({ type: 'executionCount', count: execution.executionCount });
    return { type: 'end', execution };
  });
  const finish = () => {
    isDone = true;
    wake?.();
  };
  final.then(finish, finish);
  async function* events(): AsyncGenerator<object> {
    for (;;) {
      while (queue.length > 0) yield queue.shift()!;
      if (isDone) break;
      await new Promise<void>((resolve) => (wake = resolve));
      wake = undefined;
    }
    await final;
    yield { type: 'exit' };
  }
  return { kind: 'ndjson', status: 200, events: events(), final };
}

export function codeRoutes(services: ServerServices): AnyRoute[] {
  const interpreter = (tenantId: string, sandboxId: string): InterpreterService => {
    requireSandbox(services, tenantId, sandboxId);
    return services.engine.interpreter(tenantId, sandboxId);
  };
  const base = '/v1/sandboxes/:sandboxId';
  return [
    defineRoute({
      name: 'code.run',
      wakes: true,
      method: 'POST',
      url: `${base}/code`,
      summary: 'Run code in an interpreter context; streams its output, results and errors as they happen',
      auth: 'tenant',
      params: SandboxIdParams,
      body: RunCodeBody,
      responses: {
        200: { description: 'NDJSON events, ending with end {execution}', schema: CodeEventSchema, contentType: 'application/x-ndjson' },
        404: error('No such sandbox or context'),
        409: error('The sandbox is not running'),
      },
      audit: ({ params, body }) => ({ sandboxId: params.sandboxId, subject: body.code }),
      handler({ params, body, principal, signal }) {
        const service = interpreter(principal.tenantId, params.sandboxId);
        // A context that is unknown or of another language is refused before the stream starts.
        const context = body.contextId === undefined ? undefined : service.listContexts().find((c) => c.id === body.contextId);
        if (body.contextId !== undefined && context === undefined) {
          throw new SandboxError('NOT_FOUND', `sandbox ${params.sandboxId} has no interpreter context ${body.contextId}`, {
            details: { contextId: body.contextId },
            hint: `List the contexts (GET /v1/sandboxes/${params.sandboxId}/contexts) or create one.`,
          });
        }
        if (context !== undefined && body.language !== undefined && body.language !== context.language) {
          throw new SandboxError('INVALID_ARGUMENT', `context ${context.id} runs ${context.language}, not ${body.language}`, {
            details: { field: 'language', contextId: context.id },
            hint: 'Pass either contextId or language, or a context of that language.',
          });
        }
        const { code, ...options } = body;
        // A client that goes away interrupts the code (signal); the context keeps its state.
        return streamRun((push) =>
          service.runCode(code, {
            ...options,
            signal,
            onStdout: (text) => push({ type: 'stdout', text }),
            onStderr: (text) => push({ type: 'stderr', text }),
            onResult: (result) => push({ type: 'result', result }),
            onError: (e) => push({ type: 'error', error: e }),
          }),
        );
      },
    }),
    defineRoute({
      name: 'contexts.create',
      wakes: true,
      method: 'POST',
      url: `${base}/contexts`,
      summary: 'Create an interpreter context (python, js or ts) that keeps its state between runs',
      auth: 'tenant',
      params: SandboxIdParams,
      body: CreateContextBody,
      responses: { 201: { description: 'The context', schema: ContextInfoSchema }, 404: error('No such sandbox'), 409: error('The sandbox is not running') },
      audit: ({ params, body }) => ({ sandboxId: params.sandboxId, subject: body.language ?? 'python' }),
      async handler({ params, body, principal, signal }) {
        const info = await interpreter(principal.tenantId, params.sandboxId).createContext({ ...body, signal });
        return { kind: 'json', status: 201, body: info };
      },
    }),
    defineRoute({
      name: 'contexts.list',
      wakes: true,
      method: 'GET',
      url: `${base}/contexts`,
      summary: 'List the interpreter contexts of a sandbox',
      auth: 'tenant',
      params: SandboxIdParams,
      responses: { 200: { description: 'Contexts', schema: z.object({ contexts: z.array(ContextInfoSchema) }) } },
      handler({ params, principal }) {
        return { kind: 'json', status: 200, body: { contexts: interpreter(principal.tenantId, params.sandboxId).listContexts() } };
      },
    }),
    defineRoute({
      name: 'contexts.restart',
      wakes: true,
      method: 'POST',
      url: `${base}/contexts/:contextId/restart`,
      summary: 'Restart a context: a fresh interpreter, its state gone (also after a memory limit)',
      auth: 'tenant',
      params: ContextParams,
      responses: { 204: { description: 'Restarted' }, 404: error('No such sandbox or context') },
      audit: ({ params }) => ({ sandboxId: params.sandboxId, subject: params.contextId }),
      async handler({ params, principal, signal }) {
        await interpreter(principal.tenantId, params.sandboxId).restartContext(params.contextId, { signal });
        return { kind: 'empty', status: 204 };
      },
    }),
    defineRoute({
      name: 'contexts.delete',
      wakes: true,
      method: 'DELETE',
      url: `${base}/contexts/:contextId`,
      summary: 'Shut a context down',
      auth: 'tenant',
      params: ContextParams,
      responses: { 204: { description: 'Deleted' }, 404: error('No such sandbox or context') },
      audit: ({ params }) => ({ sandboxId: params.sandboxId, subject: params.contextId }),
      async handler({ params, principal }) {
        await interpreter(principal.tenantId, params.sandboxId).deleteContext(params.contextId);
        return { kind: 'empty', status: 204 };
      },
    }),
  ];
}
