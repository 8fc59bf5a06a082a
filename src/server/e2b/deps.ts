import type { FastifyInstance } from 'fastify';
import type { AnyRoute } from '../route.js';
import type { ServerServices } from '../services.js';
import type { EnvdTokens } from './access.js';

/** What the facade's resources share: the server's services and the envd access tokens. */
export interface E2bContext extends ServerServices {
  tokens: EnvdTokens;
}

/** The envd version the facade reports: what it implements, by the SDK's version gates. */
export const ENVD_VERSION = '0.5.7';

/** The route constraint selecting one E2B port (see index.ts). */
// A type alias (not an interface) so it fits Fastify's indexed RouteConstraint.
export type PortConstraint = { e2bPort: string };

/**
 * JSON bodies as E2B's clients send them: some POSTs carry `Content-Type: application/json` and
 * no body at all (code-interpreter restart), which Fastify's own parser refuses.
 */
export function lenientJson(app: FastifyInstance): void {
  app.removeContentTypeParser('application/json');
  app.addContentTypeParser('application/json', { parseAs: 'string' }, (_request, body, done) => {
    const text = typeof body === 'string' ? body : body.toString('utf8');
    if (text.trim() === '') return done(null, undefined);
    try {
      done(null, JSON.parse(text) as unknown);
    } catch (error) {
      (error as { statusCode?: number }).statusCode = 400;
      done(error as Error, undefined);
    }
  });
}

/**
 * envd traffic acts inside its sandbox: a paused sandbox created with `lifecycle.autoResume` is
 * resumed by it, as E2B resumes one on traffic. Health probes only look (`isRunning()` stays false).
 */
export function envdTraffic(route: AnyRoute): AnyRoute {
  return route.name.endsWith('health') ? route : { ...route, wakes: true };
}
