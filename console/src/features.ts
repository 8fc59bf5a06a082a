/**
 * What this server's API offers, read once from GET /openapi.json: pages for templates,
 * snapshots and forks appear when their endpoints exist and stay away when they do not.
 */
let paths: Promise<Set<string>> | undefined;

export function loadFeatures(): Promise<Set<string>> {
  paths ??= fetch('/openapi.json')
    .then((r) => (r.ok ? (r.json() as Promise<{ paths?: Record<string, Record<string, unknown>> }>) : { paths: {} }))
    .then((doc) => new Set(Object.entries(doc.paths ?? {}).flatMap(([path, methods]) => Object.keys(methods).map((m) => `${m.toUpperCase()} ${path}`))))
    .catch(() => new Set<string>());
  return paths;
}

export const FEATURES = {
  templates: 'GET /v1/templates',
  snapshotCreate: 'POST /v1/sandboxes/{sandboxId}/snapshots',
  snapshotList: 'GET /v1/sandboxes/{sandboxId}/snapshots',
  fork: 'POST /v1/sandboxes/{sandboxId}/fork',
  changes: 'GET /v1/sandboxes/{sandboxId}/changes',
} as const;
