import { SandboxError } from '../errors/index.js';
import type { SandboxSpecInput } from '../sandbox-spec/index.js';
import type { LiveSandbox } from './sandbox-table.js';
import type { TemplateImage } from './templates.js';

/** How long a template's ready check may take to pass before the create fails. */
const READY_DEADLINE_MS = 60_000;
const READY_POLL_MS = 100;

/**
 * The spec a create asked for, on top of its template's defaults: the template's env under the
 * spec's, its working directory and user unless the spec names them. The stored spec then says
 * everything a process of the sandbox starts with, also after a restart.
 */
export function withTemplate(input: SandboxSpecInput, image: TemplateImage): SandboxSpecInput {
  return {
    ...input,
    template: image.ref,
    ...(input.cwd === undefined && image.workdir !== undefined ? { cwd: image.workdir } : {}),
    ...(input.user === undefined && image.user !== undefined ? { user: image.user } : {}),
    ...(Object.keys(image.env).length > 0 ? { env: { ...image.env, ...(input.env ?? {}) } } : {}),
  };
}

/**
 * A template's start command, in the background, then its ready check until it exits 0 (E2B's
 * semantics: a create returns when the sandbox is ready). Without either, nothing to do.
 * TEMPLATE_NOT_READY names what failed; the caller ends the sandbox.
 */
export async function startTemplate(entry: LiveSandbox, image: TemplateImage, signal?: AbortSignal): Promise<void> {
  const sandbox = entry.sandbox;
  if (!sandbox || (image.startCmd === undefined && image.readyCmd === undefined)) return;
  const shell = (line: string) => ['/bin/sh', '-c', line];
  if (image.startCmd !== undefined) {
    const started = await entry.processes.start(entry.info, sandbox, { argv: shell(image.startCmd), tag: 'start', timeoutMs: entry.info.spec.limits.wallClockMs }, entry.quotaBytes);
    void started.result.catch(() => undefined);
  }
  if (image.readyCmd === undefined) return;
  const deadline = Date.now() + READY_DEADLINE_MS;
  let last = '';
  for (;;) {
    signal?.throwIfAborted();
    const check = await entry.processes.start(entry.info, sandbox, { argv: shell(image.readyCmd), tag: 'ready', timeoutMs: READY_DEADLINE_MS }, entry.quotaBytes);
    const result = await check.result;
    if (result.outcome === 'ok') return;
    last = result.stderr.trim().slice(-500) || `exit code ${result.exitCode ?? 'none'}`;
    if (Date.now() > deadline) {
      throw new SandboxError('TEMPLATE_NOT_READY', `template ${image.ref}: its ready check \`${image.readyCmd}\` did not pass within ${READY_DEADLINE_MS / 1000} s (${last})`, {
        details: { template: image.ref, readyCmd: image.readyCmd },
        hint: 'Check the template\'s start command (its output is in the process tagged "start") and its ready command.',
      });
    }
    await new Promise((resolve) => setTimeout(resolve, READY_POLL_MS));
  }
}
