import type { LogEntry } from './build-log.js';

/** What a sandbox made from the template starts with, unless its spec or the call says otherwise. */
export interface TemplateConfig {
  env: Record<string, string>;
  /** Working directory of processes. */
  workdir: string;
  /** The user processes run as: a name from the template's /etc/passwd or `uid[:gid]`. */
  user: string;
  /**
   * Started in the background when a sandbox starts, as a shell line (`/bin/sh -c`): a Dockerfile's
   * CMD/ENTRYPOINT or an image's Entrypoint + Cmd, quoted; E2B's startCmd as given.
   */
  startCmd?: string;
  /** Polled after the start command until it exits 0, as a shell line (E2B's readyCmd). */
  readyCmd?: string;
}

/** Where a template's root came from. */
export type TemplateParent =
  | { kind: 'debian'; suite: string; packages: string[] }
  | { kind: 'image'; ref: string; digest: string }
  | { kind: 'template'; id: string; name: string }
  | { kind: 'scratch' };

export type TemplateSource = 'debian' | 'image' | 'dockerfile';

export interface TemplateRecord {
  /** 20 hex digits; stable for this build of the template. */
  id: string;
  /** Tenant id, or `_public` for the operator's templates every tenant may use. */
  owner: string;
  name: string;
  /** Tags pointing at this template now (filled in when read). */
  tags: string[];
  /** The read-only layer that is the template's root. */
  layer: string;
  config: TemplateConfig;
  /** Bytes of the root (shared with other templates included) and bytes held by its top layer alone. */
  size: { referencedBytes: number; exclusiveBytes: number };
  parent: TemplateParent;
  source: TemplateSource;
  /** The build that made it: its record keeps the log. */
  buildId: string;
  createdAt: string;
}

export type BuildStatus = 'building' | 'ready' | 'error';

export interface BuildRecord {
  id: string;
  owner: string;
  /** `name:tag` the build was asked to make. */
  target: string;
  status: BuildStatus;
  startedAt: string;
  finishedAt?: string;
  templateId?: string;
  /** Per step: the instruction, its layer key and whether it came from the cache. */
  steps: { step: string; instruction: string; key: string; cached: boolean }[];
  error?: { code: string; message: string; step?: string; details?: Record<string, unknown> };
  log: LogEntry[];
  /** Log entries dropped from the middle of a long log. */
  logDropped: number;
}
