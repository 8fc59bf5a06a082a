import { z } from 'zod';
import { LimitsSchema, NetworkPolicySchema, TEMPLATE_REF } from '../sandbox-spec/index.js';
import { InlineErrorSchema } from './process.js';

/** A template's name, `name[:tag]`, or its id (20 hex digits). */
export const TemplateRefParams = z.strictObject({
  ref: z.string().regex(TEMPLATE_REF, 'must be a template name[:tag] or id'),
});

/** What a sandbox made from the template starts with, unless its spec or the call says otherwise. */
export const TemplateConfigSchema = z.object({
  env: z.record(z.string(), z.string()),
  workdir: z.string(),
  user: z.string(),
  /** Started in the background when a sandbox starts, as a shell line. */
  startCmd: z.string().optional(),
  /** Polled after the start command until it exits 0, as a shell line. */
  readyCmd: z.string().optional(),
});

export const TemplateParentSchema = z.discriminatedUnion('kind', [
  z.object({ kind: z.literal('debian'), suite: z.string(), packages: z.array(z.string()) }),
  z.object({ kind: z.literal('image'), ref: z.string(), digest: z.string() }),
  z.object({ kind: z.literal('template'), id: z.string(), name: z.string() }),
  z.object({ kind: z.literal('scratch') }),
]);

export const TemplateInfoSchema = z.object({
  /** 20 hex digits; stable for this build of the template. */
  id: z.string(),
  name: z.string(),
  /** Tags pointing at this build now. */
  tags: z.array(z.string()),
  /** The operator's template, usable by every tenant (else the caller's own). */
  public: z.boolean(),
  config: TemplateConfigSchema,
  /** Bytes of the root (shared with other templates included) and bytes of its top layer alone. */
  size: z.object({ referencedBytes: z.number(), exclusiveBytes: z.number() }),
  parent: TemplateParentSchema,
  source: z.enum(['debian', 'image', 'dockerfile']),
  /** The build that made it (GET /v1/templates/builds/{buildId} has its log). */
  buildId: z.string(),
  createdAt: z.string(),
});

export const BuildLogEntrySchema = z.object({
  timestamp: z.string(),
  level: z.enum(['debug', 'info', 'warn', 'error']),
  message: z.string(),
  /** The 1-based step, `base` (FROM, bootstrap, import) or `finalize`. */
  step: z.string(),
});

export const TemplateBuildInfoSchema = z.object({
  id: z.string(),
  /** `name:tag` the build was asked to make. */
  target: z.string(),
  status: z.enum(['building', 'ready', 'error']),
  startedAt: z.string(),
  finishedAt: z.string().optional(),
  templateId: z.string().optional(),
  steps: z.array(z.object({ step: z.string(), instruction: z.string(), key: z.string(), cached: z.boolean() })),
  error: InlineErrorSchema.extend({ step: z.string().optional(), details: z.record(z.string(), z.unknown()).optional() }).optional(),
  log: z.array(BuildLogEntrySchema),
  /** Log entries dropped from the middle of a long log. */
  logDropped: z.number(),
});

const MAX_CONTEXT_FILES = 10_000;
const RELATIVE_PATH = /^(?!\/)(?!.*(?:^|\/)\.\.?(?:\/|$))[^\0]{1,1024}$/;

/** One file of a Dockerfile build's context, sent inline (the whole body is at most 32 MiB). */
export const ContextFileSchema = z.strictObject({
  /** Relative to the context, `/`-separated; no `.` or `..` segments. */
  path: z.string().regex(RELATIVE_PATH, 'must be a relative path without . or .. segments'),
  /** The bytes, base64. */
  data: z.string().max(32 * 1024 * 1024),
  /** Permission bits (e.g. 0o755 for a script). @default 0o644 */
  mode: z.number().int().min(0).max(0o7777).optional(),
});

/** A Debian bootstrap (mmdebstrap) as a template's source, for a tenant and for the host alike. */
export const DebianSourceSchema = z.strictObject({
  kind: z.literal('debian'),
  /** @default the host's suite */
  suite: z.string().max(32).optional(),
  /** Packages beyond ca-certificates, curl, iproute2 and procps. */
  packages: z.array(z.string().max(201)).max(500).optional(),
});

/** An OCI image as a template's source, for a tenant and for the host alike. */
export const ImageSourceSchema = z.strictObject({
  kind: z.literal('image'),
  /** `registry/name:tag` or `…@sha256:…`, pulled with the operator's stored credentials. */
  ref: z.string().min(1).max(1024),
});

/** What a template is made from, as a tenant sends it (no host paths: the context comes inline). */
export const TemplateSourceSchema = z.discriminatedUnion('kind', [
  DebianSourceSchema,
  ImageSourceSchema,
  z.strictObject({
    kind: z.literal('dockerfile'),
    /** The Dockerfile's text. */
    dockerfile: z.string().min(1).max(1024 * 1024),
    /** The files COPY and ADD read. */
    files: z.array(ContextFileSchema).max(MAX_CONTEXT_FILES).optional(),
    buildArgs: z.record(z.string().regex(/^[A-Za-z_][A-Za-z0-9_]{0,127}$/), z.string().max(32 * 1024)).optional(),
    /** Every step makes a new layer. @default false */
    noCache: z.boolean().optional(),
    /** RUN steps' network. @default the host's apt sources (allowlist) */
    network: NetworkPolicySchema.optional(),
    /** RUN steps' limits, within the operator's maxima. */
    limits: LimitsSchema.partial().optional(),
  }),
]);

export const BuildTemplateBody = z.strictObject({
  /** `name[:tag]` of the template to make (the tag defaults to `latest`). */
  name: z.string().regex(TEMPLATE_REF, 'must be a template name[:tag]'),
  /** More tags for the same build. */
  tags: z.array(z.string().regex(/^[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}$/, 'must be a tag')).max(16).optional(),
  source: TemplateSourceSchema,
  /** Make it the operator's template, usable by every tenant (admin keys only). @default false */
  public: z.boolean().optional(),
  /** Start and ready commands (shell lines) over what the source says. */
  config: z.strictObject({ startCmd: z.string().min(1).max(8192).optional(), readyCmd: z.string().min(1).max(8192).optional() }).optional(),
});

/** A build's NDJSON lines: log entries as they come, then its end. */
export const TemplateBuildEventSchema = z.discriminatedUnion('type', [
  z.object({ type: z.literal('log'), entry: BuildLogEntrySchema }),
  z.object({ type: z.literal('done'), template: TemplateInfoSchema }),
  z.object({ type: z.literal('error'), error: InlineErrorSchema.extend({ hint: z.string().optional(), details: z.record(z.string(), z.unknown()).optional() }) }),
]);

export const TemplateBuildParams = z.strictObject({ buildId: z.string().regex(/^[0-9a-z_-]{1,64}$/, 'must be a build id') });

export type TemplateInfo = z.output<typeof TemplateInfoSchema>;
export type TemplateConfigInfo = z.output<typeof TemplateConfigSchema>;
export type TemplateBuildInfo = z.output<typeof TemplateBuildInfoSchema>;
export type BuildLogEntry = z.output<typeof BuildLogEntrySchema>;
export type TemplateSource = z.input<typeof TemplateSourceSchema>;
export type BuildTemplateRequest = z.input<typeof BuildTemplateBody>;
export type TemplateBuildEvent = z.output<typeof TemplateBuildEventSchema>;
