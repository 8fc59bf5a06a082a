import { isAbsolute } from 'node:path';
import { SandboxError } from '../../errors/index.js';

/** An image in a registry, named fully: no short-name search can send it elsewhere. */
export interface RegistryRef {
  kind: 'registry';
  /** `host[:port]`; Docker Hub is `docker.io`. */
  registry: string;
  repository: string;
  tag?: string;
  digest?: string;
  /** skopeo's name for it: `docker://registry/repository(:tag|@digest)`. */
  transport: string;
  /** The fully qualified reference, for records and messages. */
  display: string;
}

/** An image on the host's disk: an OCI layout directory or an image tarball. */
export interface HostImageRef {
  kind: 'oci' | 'oci-archive' | 'docker-archive';
  path: string;
  transport: string;
  display: string;
}

export type ImageRef = RegistryRef | HostImageRef;

const COMPONENT = /^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$/;
const TAG = /^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$/;
const DIGEST = /^sha256:[0-9a-f]{64}$/;
const HOST = /^(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*|\[[0-9a-fA-F:]+\])(?::\d{1,5})?$/;

function invalid(text: string, why: string): SandboxError {
  return new SandboxError('INVALID_ARGUMENT', `"${text}" is not an image reference: ${why}`, {
    details: { field: 'image', value: text },
    hint: 'Use registry/name:tag, registry/name@sha256:…, oci:/path/to/layout:tag, oci-archive:/path.tar or docker-archive:/path.tar.',
  });
}

/**
 * Parses an image reference the way Docker names images: a first component with a dot, a port
 * or `localhost` is the registry, anything else is on Docker Hub (`debian` is
 * `docker.io/library/debian:latest`). Host paths (`oci:`, `oci-archive:`, `docker-archive:`) must be
 * absolute.
 */
export function parseImageRef(input: string): ImageRef {
  const text = input.trim();
  for (const kind of ['oci', 'oci-archive', 'docker-archive'] as const) {
    if (!text.startsWith(`${kind}:`)) continue;
    const rest = text.slice(kind.length + 1);
    const path = rest.split(':')[0] ?? '';
    if (!isAbsolute(path)) throw invalid(text, `the path after ${kind}: must be absolute`);
    if (rest.includes('\0')) throw invalid(text, 'NUL byte');
    return { kind, path, transport: `${kind}:${rest}`, display: text };
  }
  const bare = text.startsWith('docker://') ? text.slice('docker://'.length) : text;
  let rest = bare;
  let digest: string | undefined;
  const at = rest.indexOf('@');
  if (at >= 0) {
    digest = rest.slice(at + 1);
    rest = rest.slice(0, at);
    if (!DIGEST.test(digest)) throw invalid(text, 'the digest must be sha256: and 64 hex digits');
  }
  let tag: string | undefined;
  const lastSlash = rest.lastIndexOf('/');
  const colon = rest.lastIndexOf(':');
  if (colon > lastSlash) {
    tag = rest.slice(colon + 1);
    rest = rest.slice(0, colon);
    if (!TAG.test(tag)) throw invalid(text, `"${tag}" is not a valid tag`);
  }
  const parts = rest.split('/');
  let registry = 'docker.io';
  const first = parts[0] ?? '';
  if (parts.length > 1 && (first.includes('.') || first.includes(':') || first === 'localhost' || first.startsWith('['))) {
    registry = first;
    parts.shift();
    if (!HOST.test(registry)) throw invalid(text, `"${registry}" is not a registry host`);
  }
  if (parts.length === 0 || parts.some((part) => !COMPONENT.test(part))) throw invalid(text, 'repository names are lowercase letters and digits separated by "/", ".", "_" or "-"');
  if (registry === 'docker.io' && parts.length === 1) parts.unshift('library');
  const repository = parts.join('/');
  if (tag === undefined && digest === undefined) tag = 'latest';
  const display = `${registry}/${repository}${tag === undefined ? '' : `:${tag}`}${digest === undefined ? '' : `@${digest}`}`;
  return { kind: 'registry', registry, repository, tag, digest, transport: `docker://${display}`, display };
}

/** Registries on loopback speak plain HTTP without TLS verification, as Docker allows by default. */
export function isLoopbackRegistry(registry: string): boolean {
  const host = registry.startsWith('[') ? registry.slice(1, registry.indexOf(']')) : registry.split(':')[0]!;
  return host === 'localhost' || host === '::1' || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(host);
}
