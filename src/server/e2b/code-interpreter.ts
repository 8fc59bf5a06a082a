import { Readable } from 'node:stream';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { z } from 'zod';
import { SandboxError, isSandboxError } from '../../errors/index.js';
import type { InterpreterService } from '../../engine/interpreter/index.js';
import type { CodeResult, ContextInfo, InterpreterLanguage } from '../../wire/index.js';
import type { Principal } from '../auth.js';
import { defineRoute, registerRoute, type AnyRoute, httpOnly, type Authenticate } from '../route.js';
import { envdPrincipal, sandboxOf } from './access.js';
import { plainError } from './connect-protocol.js';
import { envdTraffic, lenientJson, type E2bContext, type PortConstraint } from './deps.js';
import { toSandboxPath } from './paths.js';

/**
 * The code-interpreter server of E2B's template (port 49999) over the engine's interpreter
 * contexts: `POST /execute` streams NDJSON, `/contexts` creates, lists, restarts and deletes.
 */

const LANGUAGES: Record<string, InterpreterLanguage> = {
  python: 'python',
  python3: 'python',
  js: 'js',
  javascript: 'js',
  ts: 'ts',
  typescript: 'ts',
};

function language(name: unknown): InterpreterLanguage | undefined {
  if (name === undefined || name === null || name === '') return undefined;
  const found = typeof name === 'string' ? LANGUAGES[name.toLowerCase()] : undefined;
  if (found) return found;
  throw new SandboxError('INVALID_ARGUMENT', `language ${JSON.stringify(name)} is not available in Capsule sandboxes; use python, js or ts`);
}

/** Errors as the template's FastAPI server sends them: plain text; 404 for an unknown context. */
function sendTextError(request: FastifyRequest, reply: FastifyReply, error: unknown): FastifyReply {
  const { status, message } = plainError(error);
  if (status >= 500) request.log.error({ err: error }, 'code interpreter call failed');
  return reply.code(status).type('text/plain').send(message);
}

function resultLine(result: CodeResult): object {
  return {
    type: 'result',
    text: result.text ?? null,
    html: result.html ?? null,
    markdown: result.markdown ?? null,
    svg: result.svg ?? null,
    png: result.png ?? null,
    jpeg: result.jpeg ?? null,
    pdf: null,
    latex: result.latex ?? null,
    json: result.json ?? null,
    javascript: result.javascript ?? null,
    extra: result.extra ?? null,
    is_main_result: result.isMainResult,
  };
}

const contextBody = (info: ContextInfo) => ({ id: info.id, language: info.language === 'js' ? 'javascript' : info.language === 'ts' ? 'typescript' : 'python', cwd: info.cwd.replace(/^\/workspace(?=\/|$)/, '/home/user') });

const ExecuteBody = z
  .object({ code: z.string({ error: 'code must be a string' }), context_id: z.string().nullish(), language: z.unknown().optional(), env_vars: z.record(z.string(), z.string()).nullish() })
  .loose();
const ContextBody = z.object({ language: z.unknown().optional(), cwd: z.unknown().optional() }).loose().optional();
const ContextParams = z.object({ id: z.string().min(1) });
/** Calls the SDK may send a body with, which the server ignores. */
const AnyBody = z.unknown().optional();

/**
 * The template's code-interpreter server in its own scope (its plain-text errors, lenient JSON),
 * through the seam: authenticated by the sandbox's access token, runs audited.
 */
export function registerCodeInterpreter(app: FastifyInstance, ctx: E2bContext, constraints: PortConstraint): void {
  lenientJson(app);
  app.setErrorHandler((error, request, reply) => sendTextError(request, reply, error));
  for (const route of codeInterpreterRoutes(ctx, constraints)) registerRoute(app, ctx, envdTraffic(route));
}

function codeInterpreterRoutes(ctx: E2bContext, constraints: PortConstraint): AnyRoute[] {
  const { engine, tokens } = ctx;
  const auth: Authenticate = (request) => envdPrincipal(tokens.verify(request));
  // The engine's service of the sandbox: the v1 routes (/v1/sandboxes/{id}/code) see the same contexts.
  const interpreter = (principal: { tenantId: string; sandboxId?: string }): InterpreterService => {
    const access = sandboxOf(principal as Principal);
    return engine.interpreter(access.tenantId, access.sandboxId);
  };

  return [
    defineRoute({
      name: 'e2b.code.health',
      method: 'GET',
      url: '/health',
      summary: 'E2B code interpreter: alive',
      auth: 'none',
      constraints,
      handler: () => ({ kind: 'raw', status: 200, stream: Readable.from(['OK']), contentType: 'text/plain' }),
    }),
    defineRoute({
      name: 'e2b.code.run',
      method: 'POST',
      url: '/execute',
      summary: 'E2B code interpreter: run code, streaming NDJSON',
      auth,
      constraints,
      body: ExecuteBody,
      audit: ({ body, principal }) => ({ sandboxId: principal.sandboxId, subject: body.code }),
      handler({ body, principal, request: maybeHttp }) {
        const request = httpOnly(maybeHttp);
        const service = interpreter(principal);
        if (body.context_id && body.language) throw new SandboxError('INVALID_ARGUMENT', 'pass context_id or language, not both');
        const lang = language(body.language);
        const contextId = body.context_id ?? undefined;
        // An unknown context is a 404 before the stream starts, as the template answers.
        if (contextId !== undefined && !service.listContexts().some((c) => c.id === contextId)) {
          throw new SandboxError('NOT_FOUND', `Context ${contextId} not found`);
        }
        let settle: ((event: { type: string }) => void) | undefined;
        let fail: ((error: unknown) => void) | undefined;
        const final = new Promise<{ type: string }>((resolve, reject) => ((settle = resolve), (fail = reject)));
        const write = async (reply: FastifyReply): Promise<void> => {
          const raw = reply.raw;
          const controller = new AbortController();
          raw.once('close', () => {
            if (!raw.writableFinished) controller.abort();
          });
          reply.hijack();
          raw.writeHead(200, { 'content-type': 'application/x-ndjson', 'x-request-id': request.id });
          raw.flushHeaders();
          const line = (value: object): void => {
            if (!raw.writableEnded) raw.write(`${JSON.stringify(value)}\n`);
          };
          const timestamp = () => new Date().toISOString();
          try {
            const execution = await service.runCode(body.code, {
              ...(contextId !== undefined ? { contextId } : {}),
              ...(lang ? { language: lang } : {}),
              ...(body.env_vars ? { envVars: body.env_vars } : {}),
              signal: controller.signal,
              onStdout: (text) => line({ type: 'stdout', text, timestamp: timestamp() }),
              onStderr: (text) => line({ type: 'stderr', text, timestamp: timestamp() }),
              onResult: (result) => line(resultLine(result)),
              onError: (error) => line({ type: 'error', name: error.name, value: error.value, traceback: error.traceback }),
            });
            const end = { type: 'end', execution };
            settle?.(end);
            if (execution.limit && !execution.error) {
              line({ type: 'error', name: execution.limit.resource === 'wall_clock' ? 'TimeoutError' : 'LimitExceeded', value: execution.limit.message, traceback: '' });
            }
            if (execution.executionCount !== undefined) line({ type: 'number_of_executions', execution_count: execution.executionCount });
            line({ type: 'end_of_execution' });
          } catch (error) {
            fail?.(error);
            // The headers are out: the failure becomes the execution's error.
            const wire = isSandboxError(error) ? error : undefined;
            if (!wire) request.log.error({ err: error }, 'execute failed');
            line({ type: 'error', name: wire?.code ?? 'InternalError', value: wire?.message ?? 'internal error; the server log has the details', traceback: '' });
            line({ type: 'unexpected_end_of_execution' });
          } finally {
            if (!raw.writableEnded) raw.end();
          }
        };
        return { kind: 'stream', final, write };
      },
    }),
    defineRoute({
      name: 'e2b.contexts.create',
      method: 'POST',
      url: '/contexts',
      summary: 'E2B code interpreter: create a context',
      auth,
      constraints,
      body: ContextBody,
      audit: ({ principal }) => ({ sandboxId: principal.sandboxId }),
      async handler({ body, principal }) {
        const service = interpreter(principal);
        const cwd = typeof body?.cwd === 'string' && body.cwd !== '' ? toSandboxPath(body.cwd) : undefined;
        const info = await service.createContext({ language: language(body?.language) ?? 'python', ...(cwd ? { cwd } : {}) });
        return { kind: 'json', status: 200, body: contextBody(info) };
      },
    }),
    defineRoute({
      name: 'e2b.contexts.list',
      method: 'GET',
      url: '/contexts',
      summary: 'E2B code interpreter: list contexts',
      auth,
      constraints,
      handler: ({ principal }) => ({ kind: 'json', status: 200, body: interpreter(principal).listContexts().map(contextBody) }),
    }),
    defineRoute({
      name: 'e2b.contexts.delete',
      method: 'DELETE',
      url: '/contexts/:id',
      summary: 'E2B code interpreter: delete a context',
      auth,
      constraints,
      params: ContextParams,
      audit: ({ principal }) => ({ sandboxId: principal.sandboxId }),
      async handler({ params, principal }) {
        await interpreter(principal).deleteContext(params.id);
        return { kind: 'empty', status: 200 };
      },
    }),
    defineRoute({
      name: 'e2b.contexts.restart',
      method: 'POST',
      url: '/contexts/:id/restart',
      summary: 'E2B code interpreter: restart a context',
      auth,
      constraints,
      params: ContextParams,
      body: AnyBody,
      audit: ({ principal }) => ({ sandboxId: principal.sandboxId }),
      async handler({ params, principal }) {
        await interpreter(principal).restartContext(params.id);
        return { kind: 'empty', status: 200 };
      },
    }),
  ];
}
