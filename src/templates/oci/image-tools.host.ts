import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { SandboxError } from '../../errors/index.js';
import { runCommand } from '../../host/run-command.host.js';
import { pathExists } from '../../host/fs-util.js';
import { runToolJob } from '../tool-job.host.js';
import { isLoopbackRegistry, type ImageRef } from './image-ref.js';
import { classifySkopeoError } from './skopeo-errors.js';

/** What every skopeo and umoci call of one import shares. */
export interface ImageToolContext {
  launcher: string;
  cgroupPrefix: string;
  /** Capsule's own skopeo configuration (policy, registries.conf): see ensureImageConfig. */
  configDir: string;
  /** The import's own temp dir: HOME and TMPDIR of the tools, so no user config is read. */
  tempDir: string;
  /** The operator's auth file when it holds credentials for this image's registry. */
  authFile?: string;
  /** Registries the operator allows without TLS (loopback always is). */
  insecureRegistries: readonly string[];
  onLine: (line: string) => void;
  signal?: AbortSignal;
}

/**
 * Capsule's own policy and registry configuration, so that the host's containers config cannot
 * change what an import does: only the four transports Capsule names are accepted (no
 * containers-storage:, no dir:), no short-name search, no mirrors.
 */
export async function ensureImageConfig(configDir: string): Promise<void> {
  await mkdir(join(configDir, 'registries.d'), { recursive: true, mode: 0o700 });
  const accept = { '': [{ type: 'insecureAcceptAnything' }] };
  const policy = { default: [{ type: 'reject' }], transports: { docker: accept, oci: accept, 'oci-archive': accept, 'docker-archive': accept } };
  await writeFile(join(configDir, 'policy.json'), `${JSON.stringify(policy)}\n`, { mode: 0o600 });
  await writeFile(join(configDir, 'registries.conf'), 'unqualified-search-registries = []\nshort-name-mode = "enforcing"\n', { mode: 0o600 });
}

function toolEnv(context: ImageToolContext): Record<string, string> {
  return {
    PATH: '/usr/sbin:/usr/bin:/sbin:/bin',
    HOME: context.tempDir,
    TMPDIR: context.tempDir,
    CONTAINERS_REGISTRIES_CONF: join(context.configDir, 'registries.conf'),
    LANG: 'C.UTF-8',
  };
}

function tlsVerify(ref: ImageRef, context: ImageToolContext): boolean {
  return !(ref.kind === 'registry' && (isLoopbackRegistry(ref.registry) || context.insecureRegistries.includes(ref.registry)));
}

async function skopeo(args: string[], ref: ImageRef, context: ImageToolContext, log: boolean): Promise<string> {
  const argv = ['/usr/bin/skopeo', '--policy', join(context.configDir, 'policy.json'), '--registries.d', join(context.configDir, 'registries.d'), ...args];
  const result = await runToolJob({
    argv,
    launcher: context.launcher,
    cgroupPrefix: context.cgroupPrefix,
    env: toolEnv(context),
    onLine: log ? (line) => context.onLine(line) : undefined,
    signal: context.signal,
  });
  if (result.exitCode !== 0) throw classifySkopeoError(ref.display, result.stderrTail, context.authFile !== undefined);
  return result.stdout;
}

/** The digest of the image's manifest (for a multi-arch image, of its index): the cache identity. */
export async function inspectDigest(ref: ImageRef, context: ImageToolContext): Promise<string> {
  const auth = context.authFile ? ['--authfile', context.authFile] : [];
  const tls = ref.kind === 'registry' ? [`--tls-verify=${tlsVerify(ref, context)}`] : [];
  const out = await skopeo(['inspect', ...auth, ...tls, '--format', '{{.Digest}}', ref.transport], ref, context, false);
  const digest = out.trim();
  if (!/^sha256:[0-9a-f]{64}$/.test(digest)) throw new SandboxError('IMAGE_UNSUPPORTED', `skopeo gave no digest for ${ref.display}`, { details: { output: digest.slice(0, 200) } });
  return digest;
}

/** Copies the image into the blob cache layout under `tag` (blobs it already holds are reused). */
export async function copyToLayout(ref: ImageRef, layout: string, tag: string, context: ImageToolContext): Promise<void> {
  const auth = context.authFile ? ['--src-authfile', context.authFile] : [];
  const tls = ref.kind === 'registry' ? [`--src-tls-verify=${tlsVerify(ref, context)}`] : [];
  await skopeo(['copy', '--quiet', '--remove-signatures', ...auth, ...tls, ref.transport, `oci:${layout}:${tag}`], ref, context, true);
}

/** Copies `tag` of a layout to `target` (a registry, or for the operator a layout or archive); the pushed manifest's digest. */
export async function pushLayout(layout: string, tag: string, target: ImageRef, context: ImageToolContext): Promise<string> {
  const auth = context.authFile ? ['--dest-authfile', context.authFile] : [];
  const tls = target.kind === 'registry' ? [`--dest-tls-verify=${tlsVerify(target, context)}`] : [];
  const digestFile = join(context.tempDir, 'pushed.digest');
  await skopeo(['copy', '--quiet', '--digestfile', digestFile, ...auth, ...tls, `oci:${layout}:${tag}`, target.transport], target, context, true);
  return (await readFile(digestFile, 'utf8')).trim();
}

/** One umoci call of an export as root in a job of its own; IMAGE_UNSUPPORTED naming `what` when it fails. */
export async function umoci(args: string[], what: string, context: ImageToolContext): Promise<void> {
  const result = await runToolJob({ argv: ['/usr/bin/umoci', ...args], launcher: context.launcher, cgroupPrefix: context.cgroupPrefix, env: toolEnv(context), onLine: (line) => context.onLine(line), signal: context.signal });
  if (result.exitCode !== 0) {
    throw new SandboxError('IMAGE_UNSUPPORTED', `umoci could not ${what}: ${result.stderrTail.at(-1) ?? `exit ${result.exitCode}`}`, { details: { lastLines: result.stderrTail.slice(-6) } });
  }
}

/** Unpacks `tag` of the layout into `target` (an empty subvolume) as root: whiteouts, owners, devices. */
export async function unpackLayout(layout: string, tag: string, target: string, context: ImageToolContext): Promise<void> {
  const result = await runToolJob({
    argv: ['/usr/bin/umoci', 'raw', 'unpack', '--image', `${layout}:${tag}`, target],
    launcher: context.launcher,
    cgroupPrefix: context.cgroupPrefix,
    env: toolEnv(context),
    onLine: (line) => context.onLine(line),
    signal: context.signal,
  });
  if (result.exitCode !== 0) {
    throw new SandboxError('IMAGE_UNSUPPORTED', `umoci could not unpack the image: ${result.stderrTail.at(-1) ?? `exit ${result.exitCode}`}`, {
      details: { step: 'base', lastLines: result.stderrTail.slice(-6) },
    });
  }
}

/** The first file in `root` owned by a uid or gid past 65535, or undefined (find -xdev, no links followed). */
export async function firstOversizedOwner(root: string): Promise<string | undefined> {
  const result = await runCommand(['find', root, '-xdev', '(', '-uid', '+65535', '-o', '-gid', '+65535', ')', '-print', '-quit'], { timeoutMs: 300_000 });
  const found = result.stdout.split('\n')[0];
  return found ? found.slice(root.length) || '/' : undefined;
}

/** Removes tags from the cache layout, then the blobs nothing refers to. */
export async function collectLayout(layout: string, removeTags: readonly string[]): Promise<void> {
  if (!(await pathExists(join(layout, 'index.json')))) return;
  for (const tag of removeTags) await runCommand(['umoci', 'rm', '--image', `${layout}:${tag}`]);
  await runCommand(['umoci', 'gc', '--layout', layout], { timeoutMs: 300_000 });
}
