import { createHash, randomBytes } from 'node:crypto';

/**
 * Layer keys: sha256 hex over a step's inputs (docs/briefs R1 §6, after buildkit's CacheMap and
 * buildah's generateCacheKey). Bump CACHE_VERSION when what a key covers changes meaning, so an
 * old layer is never taken for a new step.
 */
export const CACHE_VERSION = 'capsule-layer-v1';

const KEY = /^[0-9a-f]{64}$/;

export function isLayerKey(text: string): boolean {
  return KEY.test(text);
}

/**
 * sha256 over parts, each length-prefixed so that ("ab", "c") and ("a", "bc") differ. Objects are
 * hashed as JSON with sorted keys, so the order a config was assembled in does not matter.
 */
export function hashParts(...parts: unknown[]): string {
  const hash = createHash('sha256');
  hash.update(CACHE_VERSION);
  for (const part of parts) {
    const text = typeof part === 'string' ? part : canonicalJson(part);
    hash.update(`${Buffer.byteLength(text)}:`);
    hash.update(text);
  }
  return hash.digest('hex');
}

/** JSON with object keys sorted at every depth; undefined members are left out as JSON does. */
export function canonicalJson(value: unknown): string {
  return JSON.stringify(sortKeys(value));
}

function sortKeys(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(sortKeys);
  if (value !== null && typeof value === 'object') {
    const out: Record<string, unknown> = {};
    for (const key of Object.keys(value).sort()) out[key] = sortKeys((value as Record<string, unknown>)[key]);
    return out;
  }
  return value;
}

/** The layer an image becomes: one per manifest digest, shared by every tenant (it is public content). */
export function imageLayerKey(manifestDigest: string): string {
  return hashParts('image', manifestDigest);
}

/** The empty root `FROM scratch` starts from. */
export function scratchLayerKey(): string {
  return hashParts('scratch');
}

/**
 * A bootstrap is not reproducible (the archive moves on), so each one is a layer of its own: the
 * key names its inputs and a fresh nonce.
 */
export function bootstrapLayerKey(inputs: unknown): string {
  return hashParts('debian', inputs, randomBytes(16).toString('hex'));
}
