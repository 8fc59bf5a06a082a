import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import { join } from 'node:path';
import type { Readable } from 'node:stream';
import type { FastifyRequest } from 'fastify';
import { z } from 'zod';
import { SandboxError, isSandboxError } from '../../errors/index.js';
import { parseTemplateRef, PUBLIC_OWNER, type LogEntry, type TemplateService } from '../../templates/index.js';
import type { Principal } from '../auth.js';
import { defineRoute, type AnyRoute, httpOnly, type Authenticate } from '../route.js';
import type { E2bContext } from './deps.js';
import { E2bTemplateBuilds, type E2bBuild } from './template-jobs.js';
import { TemplateFiles } from './template-files.js';
import { HASH, TemplateBuildStartBody, translateTemplate, type TranslatedTemplate } from './template-steps.js';
import { linkedSignal } from '../linked-signal.js';

/** E2B's own template names: served by Capsule's default template, so never a tenant's build. */
export const E2B_DEFAULT_TEMPLATES = new Set(['base', 'code-interpreter-v1', 'code-interpreter']);
/** Where the SDK PUTs a COPY step's tar: the signed token is the path's last segment. */
const UPLOAD_PATH = '/e2b/template-files';
const MiB = 1024 * 1024;

const RequestBuildBody = z
  .object({
    name: z.string().min(1).max(200).optional(),
    alias: z.string().min(1).max(200).optional(),
    tags: z.array(z.string().min(1).max(128)).max(20).optional(),
    cpuCount: z.number().int().positive().max(256).optional(),
    memoryMB: z.number().int().positive().max(1024 * 1024).optional(),
    minFreeDiskMb: z.number().int().nonnegative().optional(),
  })
  .loose();
const BuildParams = z.object({ templateID: z.string().min(1).max(200), buildID: z.string().min(1).max(64) });
const FileParams = z.object({ templateID: z.string().min(1).max(200), hash: z.string().min(1).max(128) });
const StatusQuery = z.object({
  logsOffset: z.coerce.number().int().nonnegative().optional(),
  limit: z.coerce.number().int().positive().max(100_000).optional(),
  level: z.enum(['debug', 'info', 'warn', 'error']).optional(),
});
const LEVELS = ['debug', 'info', 'warn', 'error'];

export interface E2bTemplateState {
  service: TemplateService;
  /** Where build contexts are unpacked (one fresh directory per build, removed after). */
  contextDir: string;
  files: TemplateFiles;
  builds: E2bTemplateBuilds;
}

/** The template state of the facade, when the server has a template store. */
export function e2bTemplateState(ctx: E2bContext): E2bTemplateState | undefined {
  if (!ctx.templates) return undefined;
  const { service, contextDir, e2bFilesDir } = ctx.templates;
  return { service, contextDir, files: new TemplateFiles(e2bFilesDir ?? join(contextDir, '..', 'e2b-template-files')), builds: new E2bTemplateBuilds() };
}

/** The principal of a signed upload URL: the tenant it was signed for, nothing more. */
function uploadPrincipal(tenantId: string): Principal {
  return { tenantId, keyId: 'e2b-upload-url', isAdmin: false, grants: { mountRoots: [] } };
}

/** `name[:tag]` and tags as E2B sends them, as Capsule's `name:tag` and further tags. */
function templateName(body: z.infer<typeof RequestBuildBody>): { templateID: string; ref: string; tags: string[] } {
  const text = body.name ?? body.alias;
  if (!text) throw new SandboxError('INVALID_ARGUMENT', 'a template build needs a name', { details: { field: 'name' }, hint: 'Template.build(template, "my-template") names it.' });
  const { name, tag, tagged } = parseTemplateRef(text);
  if (E2B_DEFAULT_TEMPLATES.has(name)) {
    throw new SandboxError('INVALID_ARGUMENT', `"${name}" is one of E2B's default template names, which Capsule serves from its default template: a build cannot take it`, {
      details: { field: 'name', value: name },
      hint: 'Give the template a name of its own.',
    });
  }
  const tags = [...new Set([...(tagged ? [tag] : []), ...(body.tags ?? []).map((t) => parseTemplateRef(`${name}:${t}`).tag)])];
  if (tags.length === 0) tags.push(tag);
  return { templateID: name, ref: `${name}:${tags[0]}`, tags };
}

/** Runs a translated build: each COPY's tar unpacked into the context, then Capsule's build. */
async function runBuild(state: E2bTemplateState, build: E2bBuild, template: TranslatedTemplate, quotaBytes: number | undefined, onLog: (entry: LogEntry) => void, signal: AbortSignal) {
  await mkdir(state.contextDir, { recursive: true, mode: 0o700 });
  const contextDir = await mkdtemp(join(state.contextDir, 'e2b-'));
  try {
    for (const file of template.files) {
      await state.files.unpack(build.tenantId, file.hash, join(contextDir, file.dir)).catch((error: unknown) => {
        if (!isSandboxError(error)) throw error;
        throw new SandboxError(error.code, `step ${file.step}: ${error.message}`, { details: { ...(error.details ?? {}), step: String(file.step) }, ...(error.hint ? { hint: error.hint } : {}) });
      });
    }
    return await state.service.buildTemplate({
      owner: build.tenantId,
      name: build.ref,
      tags: build.tags.slice(1),
      source: { kind: 'dockerfile', contextDir, instructions: template.instructions, dockerfile: 'step', stepUser: 'base', noCache: template.noCache, limits: build.limits },
      config: template.config,
      allowHostPaths: false,
      // The layers a tenant's build adds are charged under the starting key's disk quota.
      ...(quotaBytes !== undefined ? { quotaBytes } : {}),
      onLog,
      signal,
    });
  } finally {
    await rm(contextDir, { recursive: true, force: true });
  }
}

/**
 * The official SDK's `Template.build()` against Capsule (docs/e2b-compatibility.md): request a
 * build (`POST /v3/templates`), an upload link per COPY (`GET /templates/{id}/files/{hash}`, a
 * signed, tenant-bound URL the SDK PUTs a tar to), the start (`POST /v2/templates/{id}/builds/
 * {buildID}`, E2B's steps translated into Capsule's build) and the status with its log from an
 * offset. A template's id is its name; `Template.exists` asks `/templates/aliases/{alias}`.
 */
export function e2bTemplateRoutes(ctx: E2bContext, state: E2bTemplateState, auth: Authenticate): AnyRoute[] {
  const { files, builds, service } = state;
  const grantOf = (request: FastifyRequest) => files.verify({ ...(request.params as { tenantId: string; hash: string }), ...(request.query as { expires?: string; signature?: string }) }, Date.now());
  const uploadAuth: Authenticate = (request) => uploadPrincipal(grantOf(request).tenantId);
  return [
    defineRoute({
      name: 'e2b.templates.request',
      method: 'POST',
      url: '/v3/templates',
      summary: 'E2B: request a template build',
      auth,
      body: RequestBuildBody,
      audit: ({ body }) => ({ subject: body.name ?? body.alias ?? '' }),
      handler({ body, principal }) {
        const named = templateName(body);
        const limits = { ...(body.cpuCount ? { cpus: body.cpuCount } : {}), ...(body.memoryMB ? { memoryBytes: body.memoryMB * MiB } : {}) };
        const build = builds.request(principal.tenantId, { ...named, limits });
        const reply = { templateID: build.templateID, buildID: build.buildID, names: [build.templateID], aliases: [build.templateID], tags: build.tags, public: false };
        return { kind: 'json', status: 202, body: reply };
      },
    }),
    defineRoute({
      name: 'e2b.templates.fileLink',
      method: 'GET',
      url: '/templates/:templateID/files/:hash',
      summary: "E2B: whether a COPY step's files are cached, and a signed URL to upload them",
      auth,
      params: FileParams,
      async handler({ params, principal, request: maybeHttp }) {
        const request = httpOnly(maybeHttp);
        if (!HASH.test(params.hash)) throw new SandboxError('INVALID_ARGUMENT', `"${params.hash}" is not a files hash (64 hex digits)`, { details: { field: 'hash' } });
        if (!builds.hasOpen(principal.tenantId, params.templateID)) {
          throw new SandboxError('NOT_FOUND', `no requested build of template ${params.templateID}`, { details: { templateID: params.templateID }, hint: 'Request the build first (POST /v3/templates); Template.build does.' });
        }
        const signed = files.sign({ tenantId: principal.tenantId, hash: params.hash }, Date.now());
        const url = `${request.protocol}://${request.host}${UPLOAD_PATH}/${principal.tenantId}/${params.hash}?${new URLSearchParams(signed).toString()}`;
        return { kind: 'json', status: 201, body: { present: await files.has(principal.tenantId, params.hash), url } };
      },
    }),
    defineRoute({
      name: 'e2b.templates.fileUpload',
      method: 'PUT',
      url: `${UPLOAD_PATH}/:tenantId/:hash`,
      summary: "E2B: upload a COPY step's files (a tar) to the signed URL",
      auth: uploadAuth,
      params: z.object({ tenantId: z.string().min(1).max(64), hash: z.string().min(1).max(128) }),
      query: z.object({ expires: z.string().max(20).optional(), signature: z.string().max(100).optional() }),
      rawBody: true,
      audit: ({ params }) => ({ subject: params.hash }),
      async handler({ body, request: maybeHttp }) {
        const request = httpOnly(maybeHttp);
        const grant = grantOf(request);
        const declared = Number(request.headers['content-length']);
        const saved = await files.save(grant, body as Readable, Number.isFinite(declared) ? declared : undefined);
        return { kind: 'json', status: 200, body: { hash: grant.hash, bytes: saved.bytes } };
      },
    }),
    defineRoute({
      name: 'e2b.templates.start',
      method: 'POST',
      url: '/v2/templates/:templateID/builds/:buildID',
      summary: "E2B: start a requested build with the template's steps",
      auth,
      params: BuildParams,
      body: TemplateBuildStartBody,
      audit: ({ params }) => ({ subject: `${params.templateID}/${params.buildID}` }),
      async handler({ params, body, principal }) {
        const build = builds.get(principal.tenantId, params.templateID, params.buildID);
        const template = translateTemplate(body);
        // A template base is looked up now: a missing one is TEMPLATE_NOT_FOUND, never an image pull.
        if (template.fromTemplate) await service.resolve(principal.tenantId, template.from);
        for (const file of template.files) {
          if (await files.has(principal.tenantId, file.hash)) continue;
          throw new SandboxError('INVALID_ARGUMENT', `step ${file.step}: the files of this COPY (hash ${file.hash}) were not uploaded`, {
            details: { step: String(file.step), hash: file.hash },
            hint: 'Upload them to the URL of GET /templates/{templateID}/files/{hash} first; Template.build does.',
          });
        }
        // A closing server cancels its builds: nothing of them is left behind.
        builds.start(build, (onLog, signal) => {
          const linked = linkedSignal(signal, ctx.closeSignal);
          return runBuild(state, build, template, principal.grants.diskQuotaBytes, onLog, linked.signal).finally(linked.release);
        });
        return { kind: 'empty', status: 202 };
      },
    }),
    defineRoute({
      name: 'e2b.templates.status',
      method: 'GET',
      url: '/templates/:templateID/builds/:buildID/status',
      summary: "E2B: a build's status and its log from an offset",
      auth,
      params: BuildParams,
      query: StatusQuery,
      handler({ params, query, principal }) {
        const build = builds.get(principal.tenantId, params.templateID, params.buildID);
        const level = query.level ? LEVELS.indexOf(query.level) : 0;
        const entries = level === 0 ? build.log : build.log.filter((e) => LEVELS.indexOf(e.level) >= level);
        const offset = query.logsOffset ?? 0;
        const logEntries = entries.slice(offset, query.limit === undefined ? undefined : offset + query.limit);
        const body = { templateID: build.templateID, buildID: build.buildID, status: build.status, logEntries, logs: [], ...(build.reason ? { reason: build.reason } : {}) };
        return { kind: 'json', status: 200, body };
      },
    }),
    defineRoute({
      name: 'e2b.templates.alias',
      method: 'GET',
      url: '/templates/aliases/:alias',
      summary: 'E2B: whether a template of that name exists for the caller',
      auth,
      params: z.object({ alias: z.string().min(1).max(200) }),
      async handler({ params, principal }) {
        if (E2B_DEFAULT_TEMPLATES.has(params.alias)) return { kind: 'json', status: 200, body: { templateID: params.alias, public: true } };
        // A bare name exists when any tag of it does (E2B's templates are names; tags are builds of one).
        const ref = (() => {
          try {
            return parseTemplateRef(params.alias);
          } catch {
            return undefined;
          }
        })();
        const found = !ref ? undefined : ref.tagged ? await service.store.find(principal.tenantId, params.alias) : (await service.list(principal.tenantId)).find((r) => r.name === ref.name);
        if (!found) {
          throw new SandboxError('TEMPLATE_NOT_FOUND', `no template named "${params.alias}"`, { details: { template: params.alias }, hint: 'Build it with Template.build.' });
        }
        return { kind: 'json', status: 200, body: { templateID: found.name, public: found.owner === PUBLIC_OWNER } };
      },
    }),
  ];
}
