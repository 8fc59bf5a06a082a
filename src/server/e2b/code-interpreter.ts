import type { FastifyInstance } from 'fastify';
import type { E2bContext, PortConstraint } from './deps.js';

/**
 * The code-interpreter server (port 49999): `POST /execute` (NDJSON) and `/contexts`. It is a
 * facade over the engine's interpreter contexts (src/engine/interpreter); until that service is
 * wired in, calls answer 501 saying so, and /health answers as the real template does.
 */
export function registerCodeInterpreter(app: FastifyInstance, ctx: E2bContext, constraints: PortConstraint): void {
  app.get('/health', { constraints }, async (_request, reply) => reply.code(200).type('text/plain').send('OK'));
  const unavailable = async (_request: unknown, reply: import('fastify').FastifyReply) => {
    void ctx;
    return reply
      .code(501)
      .type('text/plain')
      .send('interpreter contexts are not available on this Capsule server yet (runCode needs src/engine/interpreter)');
  };
  app.post('/execute', { constraints }, unavailable);
  app.get('/contexts', { constraints }, unavailable);
  app.post('/contexts', { constraints }, unavailable);
  app.delete('/contexts/:id', { constraints }, unavailable);
  app.post('/contexts/:id/restart', { constraints }, unavailable);
}
