import { z } from 'zod';
import { SandboxError } from '../errors/index.js';
import { describeIssues, LimitsSchema, NetworkPolicySchema } from '../sandbox-spec/index.js';
import { DebianSourceSchema, ImageSourceSchema } from '../wire/index.js';
import type { OnLog } from './build-log.js';
import type { Instruction } from './dockerfile/parse.js';

/** Start and ready commands a build may set on top of what its source says (E2B's template fields). */
const ConfigOverrideSchema = z.strictObject({
  startCmd: z.string().min(1).max(8192).optional(),
  readyCmd: z.string().min(1).max(8192).optional(),
});

const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]{0,127}$/;

/**
 * What a template is made from, one of three kinds, as a server or the CLI receives it:
 * - `debian`: mmdebstrap of `suite` (default: the host's) with the default packages plus `packages`;
 * - `image`: an OCI image reference (`registry/name:tag`, `…@sha256:…`; `oci:`, `oci-archive:` and
 *   `docker-archive:` host paths only when the caller allows host paths);
 * - `dockerfile`: a Dockerfile (the subset in dockerfile/parse.ts) over a context directory the
 *   caller prepared (a tenant's upload unpacked by the server, or the CLI's working directory).
 */
export const TemplateSourceSpecSchema = z.discriminatedUnion('kind', [
  DebianSourceSchema,
  ImageSourceSchema,
  z.strictObject({
    kind: z.literal('dockerfile'),
    /** The build context directory (a host path the caller owns; never a tenant's text). */
    contextDir: z.string().min(1),
    /** The Dockerfile inside the context. @default 'Dockerfile' */
    dockerfile: z.string().min(1).max(1024).optional(),
    /** The Dockerfile's text instead of a file in the context. */
    dockerfileText: z.string().max(1024 * 1024).optional(),
    /**
     * Instructions already made (E2B's template steps, translated by the facade) instead of a
     * Dockerfile; `dockerfile` then only names them in messages (`step:3: …`). Never from a wire body.
     */
    instructions: z.array(z.custom<Instruction>((value) => typeof value === 'object' && value !== null && 'kind' in value)).max(1000).optional(),
    /** Who steps run as until a USER: `root` (Docker's rule) or `base`, the base's user (E2B's). @default 'root' */
    stepUser: z.enum(['root', 'base']).optional(),
    buildArgs: z.record(z.string().regex(ENV_NAME), z.string().max(32 * 1024)).optional(),
    noCache: z.boolean().optional(),
    /** RUN steps' network. @default the host's apt sources (allowlist) */
    network: NetworkPolicySchema.optional(),
    /** RUN steps' limits (checked against the operator's maxima when a step runs). */
    limits: LimitsSchema.partial().optional(),
  }),
]);

export type TemplateSourceSpec = z.input<typeof TemplateSourceSpecSchema>;

/** One template build, of any kind: what `TemplateService.buildTemplate` takes. */
export interface TemplateBuildRequest {
  /** The owner tenant's id, or PUBLIC_OWNER (`_public`) for an operator's template. */
  owner: string;
  /** `name[:tag]` of the template to make; the tag defaults to `latest`. */
  name: string;
  /** More tags for the same template. */
  tags?: string[];
  source: TemplateSourceSpec;
  /** Overrides of the template's start and ready commands (shell lines). */
  config?: z.input<typeof ConfigOverrideSchema>;
  /**
   * Host paths are the operator's: `oci:`/`*-archive:` image references and a Dockerfile outside
   * the context are refused unless this is set. A server passes false for tenants. @default false
   */
  allowHostPaths?: boolean;
  /** Every log entry of the build, live. */
  onLog?: OnLog;
  /** Cancels the build: it rejects with ABORTED and leaves nothing behind. */
  signal?: AbortSignal;
  /** The building key's disk quota: a tenant's new layers are charged under it. @default the operator's */
  quotaBytes?: number;
}

/**
 * Checks the request's source and config: INVALID_ARGUMENT naming the field otherwise. What it
 * returns is the input as given (no defaults filled in): limits and network are completed where
 * they are used, the limits on top of DEFAULT_STEP_LIMITS, not a sandbox's defaults.
 */
export function checkBuildRequest(request: TemplateBuildRequest): { source: TemplateSourceSpec; config: z.input<typeof ConfigOverrideSchema> } {
  const source = TemplateSourceSpecSchema.safeParse(request.source);
  if (!source.success) throw invalid('source', source.error);
  const config = ConfigOverrideSchema.safeParse(request.config ?? {});
  if (!config.success) throw invalid('config', config.error);
  return { source: request.source, config: request.config ?? {} };
}

function invalid(what: string, error: z.ZodError): SandboxError {
  const issues = describeIssues(error).map((issue) => ({ ...issue, field: `${what}.${issue.field}` }));
  const first = issues[0];
  return new SandboxError('INVALID_ARGUMENT', `invalid template build: ${first ? `${first.field}: ${first.message}` : what}`, {
    details: { issues },
    hint: 'source.kind is "debian" (suite, packages), "image" (ref) or "dockerfile" (contextDir, dockerfile or dockerfileText, buildArgs, noCache, network, limits); unknown keys are refused.',
  });
}
