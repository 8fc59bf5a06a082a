import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { SandboxError } from '../../errors/index.js';
import type { OnLog, TemplateRecord, TemplateService, TemplateSourceSpec } from '../../templates/index.js';
import type { BuildTemplateBody } from '../../wire/index.js';
import type { z } from 'zod';

export interface TemplateBuildJob {
  /** Tenant id, or the public owner for an admin's public template. */
  owner: string;
  /** The building key's disk quota (the tenant's new layers are charged under it). */
  quotaBytes?: number;
  onLog: OnLog;
  signal: AbortSignal;
}

/**
 * Writes a build context sent inline into a fresh directory of its own: only directories and
 * regular files are made (never a link), each path at most once, so no write can leave it.
 */
async function writeContext(root: string, files: readonly { path: string; data: string; mode?: number | undefined }[]): Promise<void> {
  const seen = new Set<string>();
  for (const file of files) {
    if (seen.has(file.path)) {
      throw new SandboxError('INVALID_ARGUMENT', `the build context names ${file.path} twice`, { details: { field: 'source.files', path: file.path } });
    }
    seen.add(file.path);
    const target = join(root, file.path);
    await mkdir(dirname(target), { recursive: true, mode: 0o755 });
    await writeFile(target, Buffer.from(file.data, 'base64'), { flag: 'wx', mode: file.mode ?? 0o644 });
  }
}

/**
 * One template build as a tenant asked for it over the API: its source never names a host path
 * (a Dockerfile's context comes inline and is written under `contextRoot`, removed afterwards).
 */
export async function buildFromRequest(
  templates: TemplateService,
  contextRoot: string,
  body: z.output<typeof BuildTemplateBody>,
  job: TemplateBuildJob,
): Promise<TemplateRecord> {
  const { source } = body;
  const build = (spec: TemplateSourceSpec) =>
    templates.buildTemplate({
      owner: job.owner,
      name: body.name,
      tags: body.tags,
      source: spec,
      config: body.config,
      allowHostPaths: false,
      onLog: job.onLog,
      signal: job.signal,
      ...(job.quotaBytes !== undefined ? { quotaBytes: job.quotaBytes } : {}),
    });
  if (source.kind !== 'dockerfile') return build(source);
  await mkdir(contextRoot, { recursive: true, mode: 0o700 });
  const contextDir = await mkdtemp(join(contextRoot, 'ctx-'));
  try {
    await writeContext(contextDir, source.files ?? []);
    const { files: _files, dockerfile, ...rest } = source;
    return await build({ ...rest, contextDir, dockerfileText: dockerfile });
  } finally {
    await rm(contextDir, { recursive: true, force: true });
  }
}
