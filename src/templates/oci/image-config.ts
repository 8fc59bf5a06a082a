import { SandboxError } from '../../errors/index.js';
import { shellJoin } from '../shell-quote.js';

/** The part of an OCI image config a template keeps. */
export interface ImageRuntimeConfig {
  env: Record<string, string>;
  workdir: string;
  user: string;
  startCmd?: string;
}

interface Descriptor {
  mediaType?: string;
  digest: string;
  annotations?: Record<string, string>;
  platform?: { os?: string; architecture?: string };
}

const INDEX_TYPES = new Set(['application/vnd.oci.image.index.v1+json', 'application/vnd.docker.distribution.manifest.list.v2+json']);
const REF_NAME = 'org.opencontainers.image.ref.name';

/**
 * Reads the config of `tag` in an OCI layout: index.json → the tagged manifest (through an image
 * index, the linux entry for `arch`) → its config blob. `readBlob(digest)` returns a blob's text.
 */
export async function readImageConfig(indexJson: string, tag: string, readBlob: (digest: string) => Promise<string>, arch = 'amd64'): Promise<ImageRuntimeConfig> {
  const index = JSON.parse(indexJson) as { manifests?: Descriptor[] };
  let descriptor = index.manifests?.find((m) => m.annotations?.[REF_NAME] === tag);
  if (!descriptor) throw unsupported(`the layout has no tag ${tag}`);
  for (let depth = 0; descriptor.mediaType !== undefined && INDEX_TYPES.has(descriptor.mediaType) && depth < 4; depth++) {
    const nested = JSON.parse(await readBlob(descriptor.digest)) as { manifests?: Descriptor[] };
    const linux = nested.manifests?.filter((m) => (m.platform?.os ?? 'linux') === 'linux') ?? [];
    const pick: Descriptor | undefined = linux.find((m) => m.platform?.architecture === arch) ?? linux[0];
    if (!pick) throw unsupported('the image index has no linux image');
    descriptor = pick;
  }
  const manifest = JSON.parse(await readBlob(descriptor.digest)) as { config?: Descriptor };
  if (!manifest.config?.digest) throw unsupported('the manifest names no config');
  const blob = JSON.parse(await readBlob(manifest.config.digest)) as { config?: ImageConfigBody };
  return runtimeConfig(blob.config ?? {});
}

interface ImageConfigBody {
  Env?: string[] | null;
  WorkingDir?: string;
  User?: string;
  Entrypoint?: string[] | null;
  Cmd?: string[] | null;
}

/** Env, WorkingDir, User and Entrypoint + Cmd (Docker's rule: Cmd are Entrypoint's arguments) as one shell line. */
export function runtimeConfig(config: ImageConfigBody): ImageRuntimeConfig {
  const env: Record<string, string> = {};
  for (const entry of config.Env ?? []) {
    const eq = entry.indexOf('=');
    if (eq > 0) env[entry.slice(0, eq)] = entry.slice(eq + 1);
  }
  const startCmd = [...(config.Entrypoint ?? []), ...(config.Cmd ?? [])];
  return {
    env,
    workdir: config.WorkingDir && config.WorkingDir.startsWith('/') ? config.WorkingDir : '/',
    user: config.User && config.User !== '' ? config.User : 'root',
    ...(startCmd.length > 0 ? { startCmd: shellJoin(startCmd) } : {}),
  };
}

function unsupported(why: string): SandboxError {
  return new SandboxError('IMAGE_UNSUPPORTED', `cannot read the image's config: ${why}`);
}
