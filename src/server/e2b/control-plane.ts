import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { z } from 'zod';
import { SandboxError, isSandboxError } from '../../errors/index.js';
import { clampLimits, type NetworkPolicyInput, type SandboxSpecInput } from '../../sandbox-spec/index.js';
import { isLiveState, type SandboxInfo, type SandboxState } from '../../wire/index.js';
import { mountGrantOf } from '../auth.js';
import { retryAfterSeconds, sendError } from '../errors.js';
import { policyOf } from '../routes/sandboxes.js';
import { defineRoute, registerRoute, type AnyRoute, type Authenticate } from '../route.js';
import { e2bPrincipal, isE2bCaller } from './access.js';
import { ENVD_VERSION, lenientJson, type E2bContext } from './deps.js';
import { liveSandbox, sandboxBody as e2bSandboxBody, TEMPLATE_KEY, unsupported } from './answers.js';
import { StateFields, withState } from './lifecycle.js';
import { stateRoutes, volumeContentRoutes } from './state-routes.js';
import { E2B_HOME, E2B_USER } from './paths.js';
import { e2bNetworkInfo, e2bNetworkPolicy, e2bNetworkUpdate } from './network.js';
import { networkPolicyOf } from '../routes/network.js';
import { E2B_DEFAULT_TEMPLATES, e2bTemplateRoutes, e2bTemplateState } from './templates.js';

/** E2B's own template names, served by the server's default template; any other is a Capsule template. */
const TEMPLATES = E2B_DEFAULT_TEMPLATES;
const MiB = 1024 * 1024;

const CreateBody = z
  .object({
    templateID: z.string().min(1).default('base'),
    timeout: z.number().int().positive().optional(),
    metadata: z.record(z.string(), z.string()).optional(),
    envVars: z.record(z.string(), z.string()).optional(),
    ...StateFields,
    mcp: z.unknown().optional(),
    network: z.unknown().optional(),
    allow_internet_access: z.boolean().optional(),
  })
  .loose();
/** E2B's network update: its options are checked by `e2bNetworkUpdate`, which names a bad field. */
const NetworkUpdateBody = z.record(z.string(), z.unknown());
const ConnectBody = z.object({ timeout: z.number().int().positive().optional(), memory: z.boolean().optional() }).loose().optional();
/** `keepMemory` of `pause()`: E2B's `memory`. */
const PauseBody = z.object({ memory: z.boolean().optional() }).loose().optional();
const TimeoutBody = z.object({ timeout: z.number().int().min(0) }).loose();
const RefreshBody = z.object({ duration: z.number().int().min(0).optional() }).loose().optional();
const IdParams = z.object({ id: z.string().min(1) });
const ListQuery = z.record(z.string(), z.string().optional());

/** Errors as E2B's API sends them, `{ code: <HTTP status>, message }`, to E2B clients. */
function sendE2bError(request: FastifyRequest, reply: FastifyReply, error: unknown): FastifyReply {
  if (!isE2bCaller(request)) return sendError(request, reply, error);
  const status = isSandboxError(error) ? error.status : (error as { statusCode?: number }).statusCode ?? 500;
  let message = isSandboxError(error) ? [error.message, error.hint].filter(Boolean).join('. ') : 'internal error';
  if (!isSandboxError(error) && status < 500) message = (error as Error).message;
  if (status >= 500) request.log.error({ err: error }, 'E2B control-plane call failed');
  const retryAfter = isSandboxError(error) ? retryAfterSeconds(error) : undefined;
  if (retryAfter !== undefined) reply.header('retry-after', String(retryAfter));
  return reply.code(status).type('application/json').send({ code: status, message });
}

/**
 * E2B's sizes are Capsule's defaults for E2B sandboxes, not the caller's request: where the
 * operator's maxima are lower, the sandbox gets the maximum. The user's timeout is never cut (a
 * timeout over the maximum is refused).
 */
function specFor(body: z.infer<typeof CreateBody>, ctx: E2bContext, internetSaid: boolean): SandboxSpecInput {
  const e2bLimits = { cpus: 2, memoryBytes: 512 * MiB, diskBytes: 1024 * MiB, wallClockMs: 3_600_000, pids: 1024, stdoutBytes: 64 * MiB, stderrBytes: 64 * MiB };
  // `false` is always the caller's (2.45's default is `true`); `true` only where it is never a default.
  const internet = body.allow_internet_access === false || internetSaid ? body.allow_internet_access : undefined;
  const network = withNetwork(e2bNetworkPolicy(body.network, internet));
  if (!TEMPLATES.has(body.templateID)) {
    // A Capsule template: its own user, home, env and workdir, under E2B's sizes.
    return { template: body.templateID, limits: clampLimits(e2bLimits, ctx.engine.maxima), env: { ...(body.envVars ?? {}) }, ttlMs: (body.timeout ?? 300) * 1000, ...network };
  }
  return {
    limits: clampLimits(e2bLimits, ctx.engine.maxima),
    env: { HOME: E2B_HOME, USER: E2B_USER, LOGNAME: E2B_USER, ...(body.envVars ?? {}) },
    cwd: E2B_HOME,
    ttlMs: (body.timeout ?? 300) * 1000,
    ...network,
  };
}

/** What the audit log records of an E2B network update: the policy it maps to, or null for one refused (the attempt is still recorded, as on /v1). */
function auditedUpdate(body: Record<string, unknown>): Record<string, unknown> | null {
  try {
    return networkPolicyOf(e2bNetworkUpdate(body));
  } catch {
    return null;
  }
}

function withNetwork(network: NetworkPolicyInput | undefined): { network?: NetworkPolicyInput } {
  return network === undefined ? {} : { network };
}

/**
 * E2B's control plane (`/sandboxes`, `/v2/sandboxes`) over the engine, through the same seam as
 * /v1: authentication (E2B keys are Capsule keys under E2B's prefix), validation, idempotency
 * and the audit chain committed together. Errors go out in E2B's shape.
 */
export function registerControlPlane(app: FastifyInstance, ctx: E2bContext): void {
  lenientJson(app);
  app.setErrorHandler((error, request, reply) => sendE2bError(request, reply, error));
  for (const route of [...controlPlaneRoutes(ctx), ...stateRoutes(ctx)]) registerRoute(app, ctx, route);
  const templates = e2bTemplateState(ctx);
  const auth: Authenticate = (request) => e2bPrincipal(request, ctx.keys);
  if (templates) for (const route of e2bTemplateRoutes(ctx, templates, auth)) registerRoute(app, ctx, route);
}

/**
 * E2B's volume content API in a scope of its own: its bodies (octet-stream uploads) are never
 * parsed, since every call is refused (state-routes.ts), in Capsule's error shape.
 */
export function registerVolumeContent(app: FastifyInstance, ctx: E2bContext): void {
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('*', (_request, payload, done) => done(null, payload));
  app.setErrorHandler((error, request, reply) => sendE2bError(request, reply, error));
  for (const route of volumeContentRoutes(ctx)) registerRoute(app, ctx, route);
}

function controlPlaneRoutes(ctx: E2bContext): AnyRoute[] {
  const { engine } = ctx;
  const auth: Authenticate = (request) => e2bPrincipal(request, ctx.keys);

  const live = (tenantId: string, sandboxId: string): SandboxInfo => liveSandbox(engine, tenantId, sandboxId);
  const sandboxBody = (info: SandboxInfo) => e2bSandboxBody(ctx, info);

  const listed = (info: SandboxInfo) => {
    const { [TEMPLATE_KEY]: template, ...metadata } = info.metadata;
    return {
      templateID: template ?? 'base',
      alias: template ?? 'base',
      sandboxID: info.sandboxId,
      clientID: 'capsule',
      startedAt: info.createdAt,
      endAt: info.expiresAt,
      cpuCount: Math.ceil(info.spec.limits.cpus),
      memoryMB: Math.round(info.spec.limits.memoryBytes / MiB),
      diskSizeMB: Math.round(info.spec.limits.diskBytes / MiB),
      metadata,
      state: info.state === 'paused' ? 'paused' : 'running',
      envdVersion: ENVD_VERSION,
      volumeMounts: info.spec.volumes.map((volume) => ({ name: volume.name, path: volume.path })),
    };
  };

  // E2B's SDK 2.45 (/sandboxes) sends allow_internet_access: true when the caller said nothing; 2.51 (/v2) only when set.
  const create = (url: string, internetSaid = url.startsWith('/v2/')) =>
    defineRoute({
      name: 'e2b.sandboxes.create',
      method: 'POST',
      url,
      summary: 'E2B: create a sandbox',
      auth,
      body: CreateBody,
      audit: ({ body, principal }) => ({ subject: body.templateID, policy: policyOf(withState(specFor(body, ctx, internetSaid), body, ctx, principal.tenantId)) }),
      async handler({ body, principal, signal }) {
        if (body.mcp !== undefined) throw unsupported('mcp', 'there is no MCP gateway in Capsule sandboxes');
        const spec = withState(specFor(body, ctx, internetSaid), body, ctx, principal.tenantId);
        const metadata = { ...(body.metadata ?? {}), [TEMPLATE_KEY]: body.templateID };
        const info = await engine.create({ tenantId: principal.tenantId, spec, metadata, signal, grants: { mountRoots: mountGrantOf(principal), diskQuotaBytes: principal.grants.diskQuotaBytes } });
        return { kind: 'json', status: 201, body: sandboxBody(info) };
      },
    });

  const connect = (url: string) =>
    defineRoute({
      name: 'e2b.sandboxes.connect',
      method: 'POST',
      url,
      summary: 'E2B: connect to (and resume) a sandbox',
      auth,
      params: IdParams,
      body: ConnectBody,
      audit: ({ params }) => ({ sandboxId: params.id }),
      async handler({ params, body, principal }) {
        let info = live(principal.tenantId, params.id);
        if (body?.memory === false && info.pause?.keepsMemory === true) {
          throw unsupported('onResume: "reboot"', 'a paused sandbox resumes with what its pause kept (here its processes and memory)', 'Resume it as it is, or pause it with keepMemory: false to have it come back with its files only.');
        }
        const resumed = info.state === 'paused';
        if (resumed) info = await engine.resume(principal.tenantId, params.id);
        // Connecting only ever extends the TTL.
        const wantedMs = (body?.timeout ?? 300) * 1000;
        if (Date.parse(info.expiresAt) < Date.now() + wantedMs) info = engine.setTimeout(principal.tenantId, params.id, wantedMs);
        return { kind: 'json', status: resumed ? 201 : 200, body: sandboxBody(info) };
      },
    });

  const list = (url: string, defaults: SandboxState[]) =>
    defineRoute({
      name: 'e2b.sandboxes.list',
      method: 'GET',
      url,
      summary: 'E2B: list sandboxes',
      auth,
      query: ListQuery,
      handler({ query, principal }) {
        const states = query.state ? query.state.split(',').map((s) => s.trim()) : defaults;
        for (const state of states) {
          if (state !== 'running' && state !== 'paused') throw new SandboxError('INVALID_ARGUMENT', `state "${state}" is not one of running, paused`);
        }
        const metadata = Object.fromEntries(new URLSearchParams(query.metadata ?? ''));
        // Sorted by start, then id. The page token is the key of the last item sent: the next page
        // starts after it, even if that sandbox has ended since.
        const key = (info: SandboxInfo) => `${info.createdAt}|${info.sandboxId}`;
        const wanted = new Set<SandboxState>(states.includes('running') ? [...(states as SandboxState[]), 'starting'] : (states as SandboxState[]));
        let all = engine
          .list({ tenantId: principal.tenantId, states: [...wanted], metadata })
          .filter((info) => !query.template || (info.metadata[TEMPLATE_KEY] ?? 'base') === query.template)
          .filter((info) => !query.startedAfter || info.createdAt > query.startedAfter)
          .sort((a, b) => (key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : 0));
        const descending = query.order === 'desc';
        if (descending) all = all.reverse();
        const after = query.nextToken ? Buffer.from(query.nextToken, 'base64url').toString() : undefined;
        const rest = after === undefined ? all : all.filter((info) => (descending ? key(info) < after : key(info) > after));
        const limit = Math.min(Math.max(Number(query.limit) || 100, 1), 1000);
        const page = rest.slice(0, limit);
        const last = page[page.length - 1];
        const headers = last && rest.length > limit ? { 'x-next-token': Buffer.from(key(last)).toString('base64url') } : undefined;
        return { kind: 'json', status: 200, body: page.map(listed), ...(headers ? { headers } : {}) };
      },
    });

  return [
    create('/sandboxes'),
    create('/v2/sandboxes'),
    connect('/sandboxes/:id/connect'),
    connect('/v2/sandboxes/:id/connect'),
    connect('/sandboxes/:id/resume'),
    list('/v2/sandboxes', ['running', 'paused']),
    list('/sandboxes', ['running']),
    defineRoute({
      name: 'e2b.sandboxes.get',
      method: 'GET',
      url: '/sandboxes/:id',
      summary: 'E2B: a sandbox',
      auth,
      params: IdParams,
      handler({ params, principal }) {
        const info = live(principal.tenantId, params.id);
        const body = {
          ...listed(info),
          envdAccessToken: ctx.tokens.issue(info.tenantId, info.sandboxId),
          ...e2bNetworkInfo(info.spec.network),
          domain: ctx.publicDomain ?? null,
          lifecycle: { onTimeout: info.spec.onTimeout, autoResume: info.spec.autoResume },
        };
        return { kind: 'json', status: 200, body };
      },
    }),
    defineRoute({
      name: 'e2b.sandboxes.kill',
      method: 'DELETE',
      url: '/sandboxes/:id',
      summary: 'E2B: kill a sandbox',
      auth,
      params: IdParams,
      audit: ({ params }) => ({ sandboxId: params.id }),
      async handler({ params, principal }) {
        const before = engine.get(principal.tenantId, params.id);
        // An ended sandbox is a 404, once its clean-up is over (kill waits for it).
        await engine.kill(principal.tenantId, params.id);
        if (!isLiveState(before.state)) live(principal.tenantId, params.id);
        return { kind: 'empty', status: 204 };
      },
    }),
    defineRoute({
      name: 'e2b.sandboxes.setNetwork',
      method: 'PUT',
      url: '/sandboxes/:id/network',
      summary: "E2B: replace a running sandbox's network policy (what the update omits is cleared)",
      auth,
      params: IdParams,
      body: NetworkUpdateBody,
      audit: ({ params, body }) => ({ sandboxId: params.id, policy: auditedUpdate(body) }),
      async handler({ params, body, principal }) {
        live(principal.tenantId, params.id);
        await engine.setNetworkPolicy(principal.tenantId, params.id, e2bNetworkUpdate(body));
        return { kind: 'empty', status: 204 };
      },
    }),
    defineRoute({
      name: 'e2b.sandboxes.pause',
      method: 'POST',
      url: '/sandboxes/:id/pause',
      summary: 'E2B: pause a sandbox',
      auth,
      params: IdParams,
      body: PauseBody,
      audit: ({ params }) => ({ sandboxId: params.id }),
      async handler({ params, body, principal }) {
        const info = live(principal.tenantId, params.id);
        if (info.state === 'paused') throw new SandboxError('CONFLICT', `sandbox ${params.id} is already paused`);
        await engine.pause(principal.tenantId, params.id, { keepMemory: body?.memory ?? true });
        return { kind: 'empty', status: 204 };
      },
    }),
    defineRoute({
      name: 'e2b.sandboxes.timeout',
      method: 'POST',
      url: '/sandboxes/:id/timeout',
      summary: 'E2B: set the time to live from now',
      auth,
      params: IdParams,
      body: TimeoutBody,
      audit: ({ params }) => ({ sandboxId: params.id }),
      handler({ params, body, principal }) {
        live(principal.tenantId, params.id);
        engine.setTimeout(principal.tenantId, params.id, Math.max(1, body.timeout * 1000));
        return { kind: 'empty', status: 204 };
      },
    }),
    defineRoute({
      name: 'e2b.sandboxes.refresh',
      method: 'POST',
      url: '/sandboxes/:id/refreshes',
      summary: 'E2B: keep a sandbox alive',
      auth,
      params: IdParams,
      body: RefreshBody,
      handler({ params, body, principal }) {
        const info = live(principal.tenantId, params.id);
        const wantedMs = (body?.duration ?? 60) * 1000;
        if (Date.parse(info.expiresAt) < Date.now() + wantedMs) engine.setTimeout(principal.tenantId, info.sandboxId, wantedMs);
        return { kind: 'empty', status: 204 };
      },
    }),
    defineRoute({
      name: 'e2b.sandboxes.metrics',
      method: 'GET',
      url: '/sandboxes/:id/metrics',
      summary: "E2B: the engine's usage samples in E2B's shape",
      auth,
      params: IdParams,
      async handler({ params, principal }) {
        const info = live(principal.tenantId, params.id);
        if (info.state !== 'running') return { kind: 'json', status: 200, body: [] };
        const { cpus, memoryBytes, diskBytes } = info.spec.limits;
        const samples = (await engine.usage(principal.tenantId, info.sandboxId)).map((s) => ({
          timestamp: s.timestamp,
          timestampUnix: Math.floor(Date.parse(s.timestamp) / 1000),
          cpuCount: Math.ceil(cpus),
          cpuUsedPct: s.cpuUsedPct,
          memUsed: s.memoryBytes,
          memTotal: memoryBytes,
          memCache: 0,
          diskUsed: s.diskBytes ?? 0,
          diskTotal: diskBytes,
        }));
        return { kind: 'json', status: 200, body: samples };
      },
    }),
  ];
}
