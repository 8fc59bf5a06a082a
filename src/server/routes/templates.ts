import { z } from 'zod';
import { SandboxError, isSandboxError } from '../../errors/index.js';
import { PUBLIC_OWNER, type LogEntry, type TemplateRecord } from '../../templates/index.js';
import {
  BuildTemplateBody,
  ErrorBodySchema,
  TemplateBuildEventSchema,
  TemplateBuildInfoSchema,
  TemplateBuildParams,
  TemplateInfoSchema,
  TemplateRefParams,
  type TemplateInfo,
} from '../../wire/index.js';
import { defineRoute, type AnyRoute } from '../route.js';
import type { ServerServices } from '../services.js';
import { buildFromRequest } from './template-builds.js';

const error = (description: string) => ({ description, schema: ErrorBodySchema });

/** A stored template as the wire shows it: the owner only as public or not. */
export function templateInfo(record: TemplateRecord): TemplateInfo {
  const { id, name, tags, config, size, parent, source, buildId, createdAt } = record;
  return { id, name, tags, public: record.owner === PUBLIC_OWNER, config, size, parent, source, buildId, createdAt };
}

/** A queue of NDJSON lines that ends when `close` is called (or the reader gives up). */
function lineQueue(signal: AbortSignal): { push(line: object): void; close(): void; lines: AsyncIterable<object> } {
  const pending: object[] = [];
  let closed = false;
  let wake: (() => void) | undefined;
  const notify = () => {
    wake?.();
    wake = undefined;
  };
  signal.addEventListener('abort', notify, { once: true });
  return {
    push(line) {
      if (closed) return;
      pending.push(line);
      notify();
    },
    close() {
      closed = true;
      notify();
    },
    lines: (async function* () {
      for (;;) {
        while (pending.length > 0) yield pending.shift()!;
        if (closed || signal.aborted) return;
        await new Promise<void>((resolve) => (wake = resolve));
      }
    })(),
  };
}

/** `/v1/templates`: a tenant's templates and the operator's public ones; builds stream their logs. */
export function templateRoutes(services: ServerServices): AnyRoute[] {
  if (!services.templates) return [];
  const { service: templates, contextDir } = services.templates;
  return [
    defineRoute({
      name: 'templates.list',
      method: 'GET',
      url: '/v1/templates',
      summary: "The caller's templates and the operator's public ones",
      auth: 'tenant',
      responses: { 200: { description: 'Templates by name', schema: z.object({ templates: z.array(TemplateInfoSchema) }) } },
      async handler({ principal }) {
        return { kind: 'json', status: 200, body: { templates: (await templates.list(principal.tenantId)).map(templateInfo) } };
      },
    }),
    defineRoute({
      name: 'templates.get',
      method: 'GET',
      url: '/v1/templates/:ref',
      summary: 'One template by name[:tag] or id',
      auth: 'tenant',
      params: TemplateRefParams,
      responses: { 200: { description: 'The template', schema: TemplateInfoSchema }, 404: error('No template of that name the caller may use') },
      async handler({ params, principal }) {
        return { kind: 'json', status: 200, body: templateInfo(await templates.resolve(principal.tenantId, params.ref)) };
      },
    }),
    defineRoute({
      name: 'templates.delete',
      method: 'DELETE',
      url: '/v1/templates/:ref',
      summary: "Remove a tag of the caller's (a bare name: every tag); layers of the caller's that nothing needs any more go with it (and its disk quota)",
      auth: 'tenant',
      params: TemplateRefParams,
      responses: { 200: { description: 'The tags removed', schema: z.object({ removed: z.array(z.string()) }) }, 404: error("No template of the caller's by that name") },
      audit: ({ params }) => ({ subject: params.ref }),
      async handler({ params, principal }) {
        return { kind: 'json', status: 200, body: { removed: await templates.remove(principal.tenantId, params.ref) } };
      },
    }),
    defineRoute({
      name: 'templates.build',
      method: 'POST',
      url: '/v1/templates',
      summary: 'Build a template (Debian bootstrap, OCI image or Dockerfile); NDJSON log lines, then done or error',
      auth: 'tenant',
      body: BuildTemplateBody,
      bodyLimitBytes: 48 * 1024 * 1024,
      responses: {
        200: { description: 'NDJSON build events, ending with done or error', schema: TemplateBuildEventSchema, contentType: 'application/x-ndjson' },
        403: error('Only an admin key makes public templates'),
      },
      audit: ({ body }) => ({ subject: `${body.source.kind}:${body.name}` }),
      handler({ body, principal, signal }) {
        if (body.public === true && !principal.isAdmin) {
          throw new SandboxError('PERMISSION_DENIED', 'only an admin key makes public templates', {
            details: { field: 'public' },
            hint: "Leave out public: the template is then the caller's own; the operator builds public ones.",
          });
        }
        const owner = body.public === true ? PUBLIC_OWNER : principal.tenantId;
        const queue = lineQueue(signal);
        const onLog = (entry: LogEntry) => queue.push({ type: 'log', entry });
        // A client that goes away cancels its build: nothing of it is left behind.
        const quotaBytes = principal.grants.diskQuotaBytes;
        const final = buildFromRequest(templates, contextDir, body, { owner, onLog, signal, ...(quotaBytes !== undefined ? { quotaBytes } : {}) })
          .then(
            (record) => ({ type: 'done', template: templateInfo(record) }),
            (cause: unknown) => {
              const wire = isSandboxError(cause) ? cause : new SandboxError('INTERNAL', (cause as Error).message);
              return { type: 'error', error: { code: wire.code, message: wire.message, ...(wire.hint ? { hint: wire.hint } : {}), ...(wire.details ? { details: wire.details } : {}) } };
            },
          )
          // The seam sends the final line in place of the stream's `exit` event.
          .finally(() => {
            queue.push({ type: 'exit' });
            queue.close();
          });
        return { kind: 'ndjson', status: 200, events: queue.lines, final };
      },
    }),
    defineRoute({
      name: 'templates.builds.get',
      method: 'GET',
      url: '/v1/templates/builds/:buildId',
      summary: 'A build of the caller (or of a public template): status, steps and log',
      auth: 'tenant',
      params: TemplateBuildParams,
      responses: { 200: { description: 'The build', schema: TemplateBuildInfoSchema }, 404: error('No such build') },
      async handler({ params, principal }) {
        const build = (await templates.getBuild(principal.tenantId, params.buildId)) ?? (await templates.getBuild(PUBLIC_OWNER, params.buildId));
        if (!build) {
          throw new SandboxError('NOT_FOUND', `no build ${params.buildId}`, {
            details: { buildId: params.buildId },
            hint: "A template's buildId names the build that made it (GET /v1/templates/{ref}).",
          });
        }
        const { owner: _owner, ...rest } = build;
        return { kind: 'json', status: 200, body: rest };
      },
    }),
  ];
}
