/**
 * What this server's API offers, read from GET /openapi.json: pages for templates, snapshots and
 * forks appear when their endpoints exist and stay away when they do not. The document is large
 * (~200 KB): it is read once per tab, and only which of FEATURES exist is kept (sessionStorage).
 */
const STORAGE_KEY = 'capsule.features';
let paths: Promise<Set<string>> | undefined;

export const FEATURES = {
  templates: 'GET /v1/templates',
  snapshotCreate: 'POST /v1/sandboxes/{sandboxId}/snapshots',
  snapshotList: 'GET /v1/sandboxes/{sandboxId}/snapshots',
  fork: 'POST /v1/sandboxes/{sandboxId}/fork',
  changes: 'GET /v1/sandboxes/{sandboxId}/changes',
} as const;

function remembered(): Set<string> | undefined {
  try {
    const list = JSON.parse(sessionStorage.getItem(STORAGE_KEY) ?? 'null') as unknown;
    return Array.isArray(list) ? new Set(list.filter((f): f is string => typeof f === 'string')) : undefined;
  } catch {
    return undefined;
  }
}

export function loadFeatures(): Promise<Set<string>> {
  const kept = remembered();
  if (kept) return Promise.resolve(kept);
  paths ??= fetch('/openapi.json')
    .then((r) => (r.ok ? (r.json() as Promise<{ paths?: Record<string, Record<string, unknown>> }>) : { paths: {} }))
    .then((doc) => {
      const all = new Set(Object.entries(doc.paths ?? {}).flatMap(([path, methods]) => Object.keys(methods).map((m) => `${m.toUpperCase()} ${path}`)));
      const present = Object.values(FEATURES).filter((f) => all.has(f));
      sessionStorage.setItem(STORAGE_KEY, JSON.stringify(present));
      return new Set<string>(present);
    })
    .catch(() => new Set<string>());
  return paths;
}
