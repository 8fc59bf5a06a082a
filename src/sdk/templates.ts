import { resolveConfig, type ConnectionOptions } from './config.js';
import { ConnectionError, errorFromStreamEvent } from './errors.js';
import { HttpClient } from './http.js';
import { readNdjson } from './ndjson.js';
import type { BuildLogEntry, BuildTemplateRequest, TemplateBuildEvent, TemplateBuildInfo, TemplateInfo, TemplateSource } from '../wire/index.js';

export type { BuildLogEntry, BuildTemplateRequest, TemplateBuildInfo, TemplateInfo, TemplateSource };

export interface BuildOptions extends ConnectionOptions {
  /** Every log line of the build as it happens (step by step). */
  onLog?: (entry: BuildLogEntry) => void;
  /** Cancels the build: the server stops it and keeps nothing of it. */
  signal?: AbortSignal;
}

/** A build takes minutes (a Debian bootstrap): no deadline of its own unless one is given. */
const BUILD_TIMEOUT_MS = 0;

function path(ref: string): string {
  return `/v1/templates/${encodeURIComponent(ref)}`;
}

/**
 * Templates on a Capsule server: root filesystems with their defaults, built from a Debian
 * bootstrap, an OCI image or a Dockerfile, and named by sandboxes' `spec.template`. A tenant sees
 * its own templates and the operator's public ones.
 */
export class Template {
  /**
   * Builds a template and resolves with it once it is stored; rejects with the build's error
   * (BUILD_FAILED naming the step, IMAGE_NOT_FOUND, REGISTRY_UNREACHABLE, ...). Log lines arrive
   * through `onLog` while it runs.
   */
  static async build(request: BuildTemplateRequest, options: BuildOptions = {}): Promise<TemplateInfo> {
    const http = new HttpClient(resolveConfig(options));
    const open = await http.open({ method: 'POST', path: '/v1/templates', json: request, timeoutMs: options.timeoutMs ?? BUILD_TIMEOUT_MS, signal: options.signal });
    let ended = false;
    try {
      for await (const event of readNdjson<TemplateBuildEvent>(open.chunks())) {
        if (event.type === 'log') options.onLog?.(event.entry);
        else if (event.type === 'done') {
          ended = true;
          return event.template;
        } else {
          ended = true;
          throw errorFromStreamEvent(event.error);
        }
      }
      throw new ConnectionError('SERVER_UNREACHABLE', 'the build stream ended before the build did', { hint: 'See the build with GET /v1/templates/builds/{id} or list templates; retry the build.' });
    } finally {
      if (ended) open.finish();
      else open.close();
    }
  }

  /** The caller's templates and the operator's public ones. */
  static async list(options: ConnectionOptions = {}): Promise<TemplateInfo[]> {
    const http = new HttpClient(resolveConfig(options));
    return (await http.json<{ templates: TemplateInfo[] }>({ method: 'GET', path: '/v1/templates' })).templates;
  }

  /** One template by `name[:tag]` or id (TemplateNotFoundError otherwise). */
  static async get(ref: string, options: ConnectionOptions = {}): Promise<TemplateInfo> {
    const http = new HttpClient(resolveConfig(options));
    return http.json<TemplateInfo>({ method: 'GET', path: path(ref) });
  }

  /** Removes a tag of the caller's (a bare name: every tag); returns the tags removed. */
  static async delete(ref: string, options: ConnectionOptions = {}): Promise<string[]> {
    const http = new HttpClient(resolveConfig(options));
    return (await http.json<{ removed: string[] }>({ method: 'DELETE', path: path(ref) })).removed;
  }

  /** A build's status, steps and log (a template's `buildId`). */
  static async getBuild(buildId: string, options: ConnectionOptions = {}): Promise<TemplateBuildInfo> {
    const http = new HttpClient(resolveConfig(options));
    return http.json<TemplateBuildInfo>({ method: 'GET', path: `/v1/templates/builds/${encodeURIComponent(buildId)}` });
  }
}
