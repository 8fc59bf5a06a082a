import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { z } from 'zod';
import { SandboxError, isSandboxError } from '../../errors/index.js';
import type { CreateSandboxCommand, SandboxInfo, SandboxState } from '../../engine/types.js';
import type { SandboxSpecInput } from '../../spec/index.js';
import { AuditTrail } from '../audit-trail.js';
import type { Principal } from '../auth.js';
import { retryAfterSeconds, sendError } from '../errors.js';
import { e2bPrincipal, isE2bCaller } from './access.js';
import { ENVD_VERSION, lenientJson, type E2bContext, type E2bEngine } from './deps.js';
import { E2B_HOME, E2B_USER } from './paths.js';

/** Templates the facade serves: one image, Capsule's, under E2B's default names. */
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
const ConnectBody = z.object({ timeout: z.number().int().positive().optional() }).loose();
const TimeoutBody = z.object({ timeout: z.number().int().min(0) }).loose();
const RefreshBody = z.object({ duration: z.number().int().min(0).optional() }).loose();

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

function parse<T>(schema: z.ZodType<T>, value: unknown): T {
  const result = schema.safeParse(value ?? {});
  if (result.success) return result.data;
  const issue = result.error.issues[0];
  throw new SandboxError('INVALID_ARGUMENT', `body.${issue?.path.join('.') ?? ''}: ${issue?.message ?? 'invalid'}`);
}

function unsupported(field: string, why: string): SandboxError {
  return new SandboxError('INVALID_ARGUMENT', `${field} is not supported by Capsule's E2B facade: ${why}`, {
    details: { field },
    hint: 'Remove the option; docs/e2b-compatibility.md lists what is supported.',
  });
}

function specFor(body: z.infer<typeof CreateBody>): SandboxSpecInput {
  return {
    limits: { cpus: 2, memoryBytes: 512 * MiB, diskBytes: 1024 * MiB, wallClockMs: 3_600_000, pids: 1024, stdoutBytes: 64 * MiB, stderrBytes: 64 * MiB },
    env: { HOME: E2B_HOME, USER: E2B_USER, LOGNAME: E2B_USER, ...(body.envVars ?? {}) },
    cwd: E2B_HOME,
    ttlMs: (body.timeout ?? 300) * 1000,
  };
}

/**
 * E2B's sizes are Capsule's defaults for E2B sandboxes, not the caller's request: where the
 * operator's maxima are lower, the sandbox gets the maximum (the user's timeout is never cut).
 */
async function createWithinMaxima(engine: E2bEngine, command: CreateSandboxCommand & { spec: SandboxSpecInput }): Promise<SandboxInfo> {
  for (let attempt = 0; ; attempt++) {
    try {
      return await engine.create(command);
    } catch (error) {
      const details = isSandboxError(error, 'SPEC_EXCEEDS_MAXIMUM') ? (error.details as { field?: unknown; maximum?: unknown } | undefined) : undefined;
      const key = typeof details?.field === 'string' ? /^limits\.(\w+)$/.exec(details.field)?.[1] : undefined;
      if (!key || typeof details?.maximum !== 'number' || attempt >= 12) throw error;
      command.spec.limits = { ...command.spec.limits, [key]: details.maximum };
    }
  }
}

function isLive(state: SandboxState): boolean {
  return state === 'starting' || state === 'running' || state === 'paused';
}

export function registerControlPlane(app: FastifyInstance, ctx: E2bContext): void {
  const { engine } = ctx;

  /** The tenant's sandbox if it is live; ended ones are gone as far as E2B clients know. */
  const live = (tenantId: string, sandboxId: string): SandboxInfo => {
    const info = engine.get(tenantId, sandboxId);
    if (!isLive(info.state)) {
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
      domain: null,
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

  /** Runs a mutating call with an audit record, as the v1 routes' seam does. */
  const audited = async <T>(request: FastifyRequest, principal: Principal, name: string, sandboxId: string | undefined, run: () => Promise<T>): Promise<T> => {
    const trail = ctx.audit ? new AuditTrail(ctx.audit, `e2b.${name}`, principal, request.id) : undefined;
    trail?.attempt({ sandboxId });
    try {
      const result = await run();
      trail?.succeeded((result as { sandboxId?: string } | undefined)?.sandboxId);
      return result;
    } catch (error) {
      trail?.failed(error);
      throw error;
    }
  };

  lenientJson(app);
  app.setErrorHandler((error, request, reply) => sendE2bError(request, reply, error));

  const create = async (request: FastifyRequest, reply: FastifyReply) => {
    const principal = e2bPrincipal(request, ctx.keys);
    const body = parse(CreateBody, request.body);
    if (!TEMPLATES.has(body.templateID)) {
      throw new SandboxError('NOT_FOUND', `template ${body.templateID} not found: Capsule serves one image under the names ${[...TEMPLATES].join(', ')}`, {
        hint: 'Use the default template (omit it) or code-interpreter-v1.',
      });
    }
    if (body.autoPause) throw unsupported('autoPause', 'a sandbox is killed when its timeout ends');
    if (body.mcp !== undefined) throw unsupported('mcp', 'there is no MCP gateway in Capsule sandboxes');
    if (body.network !== undefined) throw unsupported('network', 'E2B sandboxes served by Capsule have no network (only loopback)');
    if (body.volumeMounts?.length) throw unsupported('volumeMounts', 'volumes are not implemented');
    const info = await audited(request, principal, 'sandboxes.create', undefined, async () => {
      const release = ctx.quota?.reserve(principal.tenantId);
      try {
        const metadata = { ...(body.metadata ?? {}), [TEMPLATE_KEY]: body.templateID };
        return await createWithinMaxima(engine, { tenantId: principal.tenantId, spec: specFor(body), metadata, diskQuotaBytes: principal.diskQuotaBytes });
      } finally {
        release?.();
      }
    });
    return reply.code(201).send(sandboxBody(info));
  };
  app.post('/sandboxes', create);
  app.post('/v2/sandboxes', create);

  const connect = async (request: FastifyRequest<{ Params: { id: string } }>, reply: FastifyReply) => {
    const principal = e2bPrincipal(request, ctx.keys);
    const body = parse(ConnectBody, request.body);
    const { id } = request.params;
    const result = await audited(request, principal, 'sandboxes.connect', id, async () => {
      let info = live(principal.tenantId, id);
      const resumed = info.state === 'paused';
      if (resumed) {
        info = await engine.resume(principal.tenantId, id);
      }
      // Connecting only ever extends the TTL.
      const wantedMs = (body.timeout ?? 300) * 1000;
      if (Date.parse(info.expiresAt) < Date.now() + wantedMs) info = engine.setTimeout(principal.tenantId, id, wantedMs);
      return { info, resumed };
    });
    return reply.code(result.resumed ? 201 : 200).send(sandboxBody(result.info));
  };
  app.post('/sandboxes/:id/connect', connect);
  app.post('/v2/sandboxes/:id/connect', connect);
  app.post('/sandboxes/:id/resume', connect);

  app.get('/sandboxes/:id', (request: FastifyRequest<{ Params: { id: string } }>, reply) => {
    const principal = e2bPrincipal(request, ctx.keys);
    const info = live(principal.tenantId, request.params.id);
    return reply.send({
      ...listed(info),
      envdAccessToken: ctx.tokens.issue(info.tenantId, info.sandboxId),
      allowInternetAccess: false,
      domain: null,
      lifecycle: { onTimeout: 'kill', autoResume: false },
    });
  });

  const list = (request: FastifyRequest<{ Querystring: Record<string, string | undefined> }>, reply: FastifyReply, defaults: SandboxState[]) => {
    const principal = e2bPrincipal(request, ctx.keys);
    const query = request.query;
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
    if (last && rest.length > limit) reply.header('x-next-token', Buffer.from(key(last)).toString('base64url'));
    return page.map(listed);
  };
  app.get('/v2/sandboxes', (request: FastifyRequest<{ Querystring: Record<string, string | undefined> }>, reply) =>
    Promise.resolve(list(request, reply, ['running', 'paused'])),
  );
  app.get('/sandboxes', (request: FastifyRequest<{ Querystring: Record<string, string | undefined> }>, reply) =>
    Promise.resolve(list(request, reply, ['running'])),
  );

  app.delete('/sandboxes/:id', async (request: FastifyRequest<{ Params: { id: string } }>, reply) => {
    const principal = e2bPrincipal(request, ctx.keys);
    const { id } = request.params;
    await audited(request, principal, 'sandboxes.kill', id, async () => {
      const before = engine.get(principal.tenantId, id);
      // An ended sandbox is a 404, once its clean-up is over (kill waits for it).
      const after = await engine.kill(principal.tenantId, id);
      if (!isLive(before.state)) live(principal.tenantId, id);
      return after;
    });
    return reply.code(204).send();
  });

  app.post('/sandboxes/:id/pause', async (request: FastifyRequest<{ Params: { id: string } }>, reply) => {
    const principal = e2bPrincipal(request, ctx.keys);
    const { id } = request.params;
    await audited(request, principal, 'sandboxes.pause', id, async () => {
      const info = live(principal.tenantId, id);
      if (info.state === 'paused') throw new SandboxError('CONFLICT', `sandbox ${id} is already paused`);
      return engine.pause(principal.tenantId, id);
    });
    return reply.code(204).send();
  });

  app.post('/sandboxes/:id/timeout', async (request: FastifyRequest<{ Params: { id: string } }>, reply) => {
    const principal = e2bPrincipal(request, ctx.keys);
    const body = parse(TimeoutBody, request.body);
    const { id } = request.params;
    await audited(request, principal, 'sandboxes.timeout', id, () => {
      live(principal.tenantId, id);
      return Promise.resolve(engine.setTimeout(principal.tenantId, id, Math.max(1, body.timeout * 1000)));
    });
    return reply.code(204).send();
  });

  app.post('/sandboxes/:id/refreshes', async (request: FastifyRequest<{ Params: { id: string } }>, reply) => {
    const principal = e2bPrincipal(request, ctx.keys);
    const body = parse(RefreshBody, request.body);
    const info = live(principal.tenantId, request.params.id);
    const wantedMs = (body.duration ?? 60) * 1000;
    if (Date.parse(info.expiresAt) < Date.now() + wantedMs) engine.setTimeout(principal.tenantId, info.sandboxId, wantedMs);
    return reply.code(204).send();
  });

  // With the server's usage sampler: its time series. Without: one sample taken now, its CPU
  // share averaged since the previous sample (or the sandbox's start). A paused sandbox has none.
  const lastCpu = new WeakMap<object, { atMs: number; usec: number }>();
  app.get('/sandboxes/:id/metrics', async (request: FastifyRequest<{ Params: { id: string } }>) => {
    const principal = e2bPrincipal(request, ctx.keys);
    const info = live(principal.tenantId, request.params.id);
    if (info.state !== 'running' || !engine.backendSandbox) return [];
    const sandbox = engine.backendSandbox(principal.tenantId, info.sandboxId);
    const cpus = info.spec.limits.cpus;
    if (ctx.usage) {
      // The server's sampler: a sample every 5 s since the sandbox started, plus one now.
      return (await ctx.usage.samples(info.sandboxId, sandbox)).map((s) => ({
        timestamp: s.timestamp,
        timestampUnix: Math.floor(Date.parse(s.timestamp) / 1000),
        cpuCount: Math.ceil(cpus),
        cpuUsedPct: s.cpuUsedPct,
        memUsed: s.memoryBytes,
        memTotal: info.spec.limits.memoryBytes,
        memCache: 0,
        diskUsed: s.diskBytes ?? 0,
        diskTotal: info.spec.limits.diskBytes,
      }));
    }
    const [counters, diskUsed] = await Promise.all([sandbox.counters(), sandbox.diskUsedBytes()]);
    const now = Date.now();
    const previous = lastCpu.get(sandbox) ?? { atMs: Date.parse(info.createdAt), usec: 0 };
    lastCpu.set(sandbox, { atMs: now, usec: counters.cpuUsageUsec });
    const cpuUsedPct = ((counters.cpuUsageUsec - previous.usec) / 1000 / Math.max(1, now - previous.atMs) / cpus) * 100;
    return [
      {
        timestamp: new Date(now).toISOString(),
        timestampUnix: Math.floor(now / 1000),
        cpuCount: Math.ceil(cpus),
        cpuUsedPct: Math.round(Math.min(100, Math.max(0, cpuUsedPct)) * 100) / 100,
        memUsed: counters.memoryUsageBytes,
        memTotal: info.spec.limits.memoryBytes,
        memCache: 0,
        diskUsed: diskUsed ?? 0,
        diskTotal: info.spec.limits.diskBytes,
      },
    ];
  });
}
