import multipart from '@fastify/multipart';
import type { FastifyInstance } from 'fastify';
import { EnvdTokens } from './access.js';
import { registerCodeInterpreter } from './code-interpreter.js';
import { registerControlPlane, registerVolumeContent } from './control-plane.js';
import type { ServerServices } from '../services.js';
import { envdTraffic, type E2bContext } from './deps.js';
import { registerRoute, type Authenticate } from '../route.js';
import { envdPrincipal } from './access.js';
import { parseConnectEnvelopes, sendConnectError } from './connect-protocol.js';
import { registerEnvdFilesRest } from './envd-files-rest.js';
import { envdFilesystemRoutes } from './envd-filesystem.js';
import { envdProcessRoutes } from './envd-process.js';

export { ENVD_VERSION } from './deps.js';

/** The ports E2B's SDK names in `E2b-Sandbox-Port` when one sandboxUrl serves everything. */
export const ENVD_PORT = '49983';
export const CODE_INTERPRETER_PORT = '49999';
/** Largest file one upload may carry; the sandbox's own disk and file-size limits apply first. */
const MAX_UPLOAD_BYTES = 4 * 1024 ** 3;

/**
 * Routes by the `E2b-Sandbox-Port` header: with it, only routes registered for that port match
 * (envd and the code interpreter share paths such as /health); without it, the control plane
 * and Capsule's own routes do.
 */
const portStrategy = {
  name: 'e2bPort',
  storage() {
    const stores = new Map<string, unknown>();
    return {
      get: (port: string) => stores.get(port) ?? null,
      set: (port: string, store: unknown) => void stores.set(port, store),
    };
  },
  deriveConstraint: (request: { headers: Record<string, string | string[] | undefined> }) => {
    const port = request.headers['e2b-sandbox-port'];
    return typeof port === 'string' ? port : undefined;
  },
  mustMatchWhenDerived: true,
};

/**
 * The E2B-compatible surface (docs/e2b-compatibility.md): a facade over the same engine, so
 * sandboxes made through it are Capsule sandboxes, visible and killable through /v1 too.
 */
export function registerE2bFacade(app: FastifyInstance, services: ServerServices, options: { tokenSecret?: Buffer } = {}): void {
  // The server's sandbox access tokens: the port proxy accepts the same ones (E2B's traffic token).
  const ctx: E2bContext = { ...services, tokens: options.tokenSecret ? new EnvdTokens(options.tokenSecret) : services.accessTokens };
  app.addConstraintStrategy(portStrategy as Parameters<FastifyInstance['addConstraintStrategy']>[0]);
  void app.register((scope, _options, done) => {
    registerControlPlane(scope, ctx);
    done();
  });
  void app.register((scope, _options, done) => {
    registerVolumeContent(scope, ctx);
    done();
  });
  const envd = { e2bPort: ENVD_PORT };
  // envd's Connect services: Connect's error shape, request envelopes decoded as bodies.
  void app.register((scope, _options, done) => {
    parseConnectEnvelopes(scope);
    scope.setErrorHandler((error, request, reply) => sendConnectError(request, reply, error));
    const auth: Authenticate = (request) => envdPrincipal(ctx.tokens.verify(request));
    for (const route of [...envdProcessRoutes(ctx, auth, envd), ...envdFilesystemRoutes(ctx, auth, envd)]) registerRoute(scope, ctx, envdTraffic(route));
    done();
  });
  // envd's REST /files (multipart uploads) and /health.
  void app.register(async (scope) => {
    await scope.register(multipart, { preservePath: true, limits: { fileSize: MAX_UPLOAD_BYTES, files: 1000, fields: 100 } });
    registerEnvdFilesRest(scope, ctx, envd);
  });
  void app.register((scope, _options, done) => {
    registerCodeInterpreter(scope, ctx, { e2bPort: CODE_INTERPRETER_PORT });
    done();
  });
}
