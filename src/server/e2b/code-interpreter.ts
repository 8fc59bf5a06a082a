import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { SandboxError, isSandboxError } from '../../errors/index.js';
import type { InterpreterService } from '../../engine/interpreter/index.js';
import type { ContextInfo, InterpreterLanguage, CodeResult } from '../../wire/index.js';
import type { SandboxAccess } from './access.js';
import { audited } from './audit.js';
import { ConnectError, connectStatus } from './connect-protocol.js';
import { lenientJson, type E2bContext, type PortConstraint } from './deps.js';
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
  let status = 500;
  let message = 'internal error in the Capsule E2B facade; the server log has the details';
  if (error instanceof ConnectError) {
    status = connectStatus(error.code);
    message = error.message;
  } else if (isSandboxError(error)) {
    status = error.status;
    message = error.message;
  } else if (typeof (error as { statusCode?: unknown }).statusCode === 'number' && (error as { statusCode: number }).statusCode < 500) {
    status = (error as { statusCode: number }).statusCode;
    message = (error as Error).message;
  }
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

export function registerCodeInterpreter(app: FastifyInstance, ctx: E2bContext, constraints: PortConstraint): void {
  const { engine, tokens } = ctx;
  // The engine's service of the sandbox: the v1 routes (/v1/sandboxes/{id}/code) see the same contexts.
  const interpreter = (access: SandboxAccess): InterpreterService => engine.interpreter(access.tenantId, access.sandboxId);

  lenientJson(app);
  app.setErrorHandler((error, request, reply) => sendTextError(request, reply, error));

  app.get('/health', { constraints }, (_request, reply) => reply.code(200).type('text/plain').send('OK'));

  app.post('/execute', { constraints }, async (request, reply) => {
    const access = tokens.verify(request);
    const service = interpreter(access);
    const body = (request.body ?? {}) as { code?: unknown; context_id?: unknown; language?: unknown; env_vars?: unknown };
    if (typeof body.code !== 'string') throw new SandboxError('INVALID_ARGUMENT', 'code must be a string');
    if (body.context_id && body.language) throw new SandboxError('INVALID_ARGUMENT', 'pass context_id or language, not both');
    const lang = language(body.language);
    // An unknown context is a 404 before the stream starts, as the template answers.
    if (typeof body.context_id === 'string' && !service.listContexts().some((c) => c.id === body.context_id)) {
      throw new SandboxError('NOT_FOUND', `Context ${body.context_id} not found`);
    }
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
      const code = body.code;
      const execution = await audited(ctx, request, access, 'code.run', { subject: code }, () => service.runCode(code, {
        ...(typeof body.context_id === 'string' ? { contextId: body.context_id } : {}),
        ...(lang ? { language: lang } : {}),
        ...(body.env_vars && typeof body.env_vars === 'object' ? { envVars: body.env_vars as Record<string, string> } : {}),
        signal: controller.signal,
        onStdout: (text) => line({ type: 'stdout', text, timestamp: timestamp() }),
        onStderr: (text) => line({ type: 'stderr', text, timestamp: timestamp() }),
        onResult: (result) => line(resultLine(result)),
        onError: (error) => line({ type: 'error', name: error.name, value: error.value, traceback: error.traceback }),
      }));
      if (execution.limit && !execution.error) {
        line({ type: 'error', name: execution.limit.resource === 'wall_clock' ? 'TimeoutError' : 'LimitExceeded', value: execution.limit.message, traceback: '' });
      }
      if (execution.executionCount !== undefined) line({ type: 'number_of_executions', execution_count: execution.executionCount });
      line({ type: 'end_of_execution' });
    } catch (error) {
      // The headers are out: the failure becomes the execution's error.
      const wire = isSandboxError(error) ? error : undefined;
      if (!wire) request.log.error({ err: error }, 'execute failed');
      line({ type: 'error', name: wire?.code ?? 'InternalError', value: wire?.message ?? 'internal error; the server log has the details', traceback: '' });
      line({ type: 'unexpected_end_of_execution' });
    } finally {
      if (!raw.writableEnded) raw.end();
    }
  });

  app.post('/contexts', { constraints }, async (request) => {
    const service = interpreter(tokens.verify(request));
    const body = (request.body ?? {}) as { language?: unknown; cwd?: unknown };
    const cwd = typeof body.cwd === 'string' && body.cwd !== '' ? toSandboxPath(body.cwd) : undefined;
    return contextBody(await service.createContext({ language: language(body.language) ?? 'python', ...(cwd ? { cwd } : {}) }));
  });

  app.get('/contexts', { constraints }, (request, reply) => reply.send(interpreter(tokens.verify(request)).listContexts().map(contextBody)));

  app.delete('/contexts/:id', { constraints }, async (request: FastifyRequest<{ Params: { id: string } }>, reply) => {
    await interpreter(tokens.verify(request)).deleteContext(request.params.id);
    return reply.code(200).send();
  });

  app.post('/contexts/:id/restart', { constraints }, async (request: FastifyRequest<{ Params: { id: string } }>, reply) => {
    await interpreter(tokens.verify(request)).restartContext(request.params.id);
    return reply.code(200).send();
  });
}
