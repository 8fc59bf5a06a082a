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
import { E2B_HOME, E2B_USER } from './paths.js';
import { e2bNetworkPolicy } from './network.js';

/** Templates the facade serves: one image, Capsule's, under E2B's default names. */
/** E2B's own template names, served by the server's default template; any other is a Capsule template. */
const TEMPLATES = new Set(['base', 'code-interpreter-v1', 'code-interpreter']);
/** Where the template name is kept in the engine's metadata; never shown to E2B clients. */
const TEMPLATE_KEY = 'capsule.e2b.template';
const MiB = 1024 * 1024;

const CreateBody = z
  .object({
    templateID: z.string().min(1).default('base'),
    timeout: z.number().int().positive().optional(),
    metadata: z.record(z.string(), z.string()).optional(),
    envVars: z.record(z.string(), z.string()).optional(),
    autoPause: z.boolean().optional(),
    mcp: z.unknown().optional(),
    network: z.unknown().optional(),
    volumeMounts: z.array(z.unknown()).optional(),
  })
  .loose();
const ConnectBody = z.object({ timeout: z.number().int().positive().optional() }).loose().optional();
const TimeoutBody = z.object({ timeout: z.number().int().min(0) }).loose();
const RefreshBody = z.object({ duration: z.number().int().min(0).optional() }).loose().optional();
const IdParams = z.object({ id: z.string().min(1) });
const ListQuery = z.record(z.string(), z.string().optional());
/** Calls the SDK may send a body with, which the facade ignores. */
const AnyBody = z.unknown().optional();

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

function unsupported(field: string, why: string): SandboxError {
  return new SandboxError('INVALID_ARGUMENT', `${field} is not supported by Capsule's E2B facade: ${why}`, {
    details: { field },
    hint: 'Remove the option; docs/e2b-compatibility.md lists what is supported.',
  });
}

/**
 * E2B's sizes are Capsule's defaults for E2B sandboxes, not the caller's request: where the
 * operator's maxima are lower, the sandbox gets the maximum. The user's timeout is never cut (a
 * timeout over the maximum is refused).
 */
function specFor(body: z.infer<typeof CreateBody>, ctx: E2bContext): SandboxSpecInput {
  const e2bLimits = { cpus: 2, memoryBytes: 512 * MiB, diskBytes: 1024 * MiB, wallClockMs: 3_600_000, pids: 1024, stdoutBytes: 64 * MiB, stderrBytes: 64 * MiB };
  if (!TEMPLATES.has(body.templateID)) {
    // A Capsule template: its own user, home, env and workdir, under E2B's sizes.
    return { template: body.templateID, limits: clampLimits(e2bLimits, ctx.engine.maxima), env: { ...(body.envVars ?? {}) }, ttlMs: (body.timeout ?? 300) * 1000 };
  }
  return {
    limits: clampLimits(e2bLimits, ctx.engine.maxima),
    env: { HOME: E2B_HOME, USER: E2B_USER, LOGNAME: E2B_USER, ...(body.envVars ?? {}) },
    cwd: E2B_HOME,
    ttlMs: (body.timeout ?? 300) * 1000,
    ...withNetwork(e2bNetworkPolicy(body.network)),
  };
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
  for (const route of controlPlaneRoutes(ctx)) registerRoute(app, ctx, route);
}

function controlPlaneRoutes(ctx: E2bContext): AnyRoute[] {
  const { engine } = ctx;
  const auth: Authenticate = (request) => e2bPrincipal(request, ctx.keys);

  /** The tenant's sandbox if it is live; ended ones are gone as far as E2B clients know. */
  const live = (tenantId: string, sandboxId: string): SandboxInfo => {
    const info = engine.get(tenantId, sandboxId);
    if (!isLiveState(info.state)) {
      throw new SandboxError('SANDBOX_NOT_FOUND', `sandbox ${sandboxId} not found (it is ${info.state})`, {
        details: { sandboxId },
        hint: 'Create a new sandbox.',
      });
    }
    return info;
  };

  const sandboxBody = (info: SandboxInfo) => {
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
  };

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
      volumeMounts: [],
    };
  };

  const create = (url: string) =>
    defineRoute({
      name: 'e2b.sandboxes.create',
      method: 'POST',
      url,
      summary: 'E2B: create a sandbox',
      auth,
      body: CreateBody,
      audit: ({ body }) => ({ subject: body.templateID, policy: policyOf(specFor(body, ctx)) }),
      async handler({ body, principal, signal }) {
        if (body.autoPause) throw unsupported('autoPause', 'a sandbox is killed when its timeout ends');
        if (body.mcp !== undefined) throw unsupported('mcp', 'there is no MCP gateway in Capsule sandboxes');
        if (body.volumeMounts?.length) throw unsupported('volumeMounts', 'volumes are not implemented');
        const metadata = { ...(body.metadata ?? {}), [TEMPLATE_KEY]: body.templateID };
        const info = await engine.create({ tenantId: principal.tenantId, spec: specFor(body, ctx), metadata, signal, grants: { mountRoots: mountGrantOf(principal), diskQuotaBytes: principal.grants.diskQuotaBytes } });
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
          allowInternetAccess: false,
          domain: ctx.publicDomain ?? null,
          lifecycle: { onTimeout: 'kill', autoResume: false },
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
      name: 'e2b.sandboxes.pause',
      method: 'POST',
      url: '/sandboxes/:id/pause',
      summary: 'E2B: pause a sandbox',
      auth,
      params: IdParams,
      body: AnyBody,
      audit: ({ params }) => ({ sandboxId: params.id }),
      async handler({ params, principal }) {
        const info = live(principal.tenantId, params.id);
        if (info.state === 'paused') throw new SandboxError('CONFLICT', `sandbox ${params.id} is already paused`);
        await engine.pause(principal.tenantId, params.id);
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
