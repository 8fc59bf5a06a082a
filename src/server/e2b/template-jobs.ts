import { randomUUID } from 'node:crypto';
import { SandboxError, isSandboxError } from '../../errors/index.js';
import type { LogEntry, TemplateRecord } from '../../templates/index.js';

/** E2B's build states (TemplateBuildStatus). */
export type E2bBuildStatus = 'waiting' | 'building' | 'ready' | 'error';

export interface E2bBuildReason {
  message: string;
  step?: string;
  logEntries: LogEntry[];
}

/** One E2B template build: requested (`waiting`), then started, then `ready` or `error`. */
export interface E2bBuild {
  tenantId: string;
  /** E2B's templateID: the template's name (so `Sandbox.create(templateID)` finds it too). */
  templateID: string;
  buildID: string;
  /** `name:tag` the build makes. */
  ref: string;
  tags: string[];
  /** Sizes of the build's RUN steps (E2B's cpuCount and memoryMB). */
  limits: { cpus?: number; memoryBytes?: number };
  status: E2bBuildStatus;
  log: LogEntry[];
  /** Entries past the log's bounds that were not kept (one line says so in the log). */
  dropped: number;
  /** Characters of the kept messages. */
  logChars: number;
  reason?: E2bBuildReason;
  /** The last entries of each step, kept past MAX_LOG_ENTRIES for a failure's reason. */
  tails: Map<string, LogEntry[]>;
  createdAtMs: number;
  finishedAtMs?: number;
  controller: AbortController;
}

/** Log kept per build (entries, and characters of their messages), so `logsOffset` polling stays exact and memory bounded. */
const MAX_LOG_ENTRIES = 10_000;
const MAX_LOG_CHARS = 2 * 1024 * 1024;
/** Finished builds a tenant's status calls can still see (the oldest go first past it). */
const KEEP_FINISHED_PER_TENANT = 10;
/** Last entries kept per step, for a failure's reason. */
const REASON_LINES = 20;
/** Builds a tenant may have that are not finished (requested or running). */
const MAX_OPEN_PER_TENANT = 8;
/** How long a finished build's status, or an unstarted request, is kept. */
const KEEP_MS = 60 * 60 * 1000;

function notFound(buildID: string): SandboxError {
  return new SandboxError('NOT_FOUND', `no template build ${buildID}`, {
    details: { buildID },
    hint: 'Builds are known to the server that took them, for an hour after they end; request a new one with Template.build.',
  });
}

/**
 * The E2B facade's template builds, in memory: E2B's API makes a build in three calls (request,
 * uploads, start) and then polls its status with a log offset, so each build keeps its whole log
 * (bounded) with stable indexes; a tenant has at most 8 open and its last 10 finished builds here.
 * Tenants see only their own builds: another's id is not found.
 * A restarted server forgets them; the templates they made stay (Capsule's records).
 */
export class E2bTemplateBuilds {
  private readonly builds = new Map<string, E2bBuild>();

  constructor(private readonly now: () => number = Date.now) {}

  request(tenantId: string, input: { templateID: string; ref: string; tags: string[]; limits: E2bBuild['limits'] }): E2bBuild {
    this.expire();
    const open = [...this.builds.values()].filter((b) => b.tenantId === tenantId && (b.status === 'waiting' || b.status === 'building'));
    if (open.length >= MAX_OPEN_PER_TENANT) {
      throw new SandboxError('LIMIT_EXCEEDED', `at most ${MAX_OPEN_PER_TENANT} template builds of a tenant may be requested or running at once`, {
        details: { limit: MAX_OPEN_PER_TENANT },
        hint: 'Wait for a build to end, then build again.',
      });
    }
    const build: E2bBuild = { tenantId, ...input, buildID: randomUUID(), status: 'waiting', log: [], dropped: 0, logChars: 0, tails: new Map(), createdAtMs: this.now(), controller: new AbortController() };
    this.builds.set(build.buildID, build);
    return build;
  }

  /** The tenant's build of that template; NOT_FOUND for another tenant's or an unknown one. */
  get(tenantId: string, templateID: string, buildID: string): E2bBuild {
    const build = this.builds.get(buildID);
    if (!build || build.tenantId !== tenantId || build.templateID !== templateID) throw notFound(buildID);
    return build;
  }

  /** Whether the tenant has a build of that template it may still upload files for. */
  hasOpen(tenantId: string, templateID: string): boolean {
    return [...this.builds.values()].some((b) => b.tenantId === tenantId && b.templateID === templateID && b.status === 'waiting');
  }

  append(build: E2bBuild, entry: LogEntry): void {
    if (build.log.length < MAX_LOG_ENTRIES && build.logChars + entry.message.length <= MAX_LOG_CHARS) {
      build.log.push(entry);
      build.logChars += entry.message.length;
    } else if (build.dropped++ === 0) {
      build.log.push({ ...entry, level: 'warn', message: `the log is longer than ${MAX_LOG_ENTRIES} lines or ${MAX_LOG_CHARS} characters: later lines are not kept (a failure still reports its last lines)` });
    }
    const tail = build.tails.get(entry.step) ?? [];
    tail.push(entry);
    if (tail.length > REASON_LINES) tail.shift();
    build.tails.set(entry.step, tail);
  }

  /**
   * Runs a requested build: `building` until `run` settles, then `ready`, or `error` with the
   * reason E2B's SDK throws as its BuildError (the message, the failed step, its last lines).
   */
  start(build: E2bBuild, run: (onLog: (entry: LogEntry) => void, signal: AbortSignal) => Promise<TemplateRecord>): void {
    if (build.status !== 'waiting') {
      throw new SandboxError('CONFLICT', `template build ${build.buildID} was already started`, { details: { buildID: build.buildID }, hint: 'Request a new build (Template.build does).' });
    }
    build.status = 'building';
    void run((entry) => this.append(build, entry), build.controller.signal).then(
      () => this.finish(build, 'ready'),
      (error: unknown) => this.finish(build, 'error', error),
    );
  }

  private finish(build: E2bBuild, status: 'ready' | 'error', error?: unknown): void {
    build.status = status;
    build.finishedAtMs = this.now();
    if (status === 'ready') return;
    const wire = isSandboxError(error) ? error : new SandboxError('INTERNAL', `the build failed: ${(error as Error)?.message ?? String(error)}`);
    const step = typeof wire.details?.step === 'string' ? wire.details.step : undefined;
    const message = wire.code === 'BUILD_FAILED' || !wire.hint ? wire.message : `${wire.message}. ${wire.hint}`;
    const entry: LogEntry = { timestamp: new Date(this.now()).toISOString(), level: 'error', message, step: step ?? 'finalize' };
    this.append(build, entry);
    build.reason = { message, ...(step !== undefined ? { step } : {}), logEntries: step !== undefined ? [...(build.tails.get(step) ?? [])] : [] };
  }

  private expire(): void {
    const cutoff = this.now() - KEEP_MS;
    const finished = new Map<string, E2bBuild[]>();
    for (const [id, build] of this.builds) {
      const since = build.finishedAtMs ?? (build.status === 'waiting' ? build.createdAtMs : undefined);
      if (since !== undefined && since < cutoff) this.builds.delete(id);
      else if (build.finishedAtMs !== undefined) finished.set(build.tenantId, [...(finished.get(build.tenantId) ?? []), build]);
    }
    for (const builds of finished.values()) {
      builds.sort((a, b) => a.finishedAtMs! - b.finishedAtMs!);
      for (const build of builds.slice(0, Math.max(0, builds.length - KEEP_FINISHED_PER_TENANT))) this.builds.delete(build.buildID);
    }
  }
}
