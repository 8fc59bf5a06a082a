import { json } from './api.js';
import type { SandboxInfo } from '../../src/wire/index.js';

/** The lifecycle calls the console makes on a sandbox, all of them public API calls. */
export const actions = {
  pause: (id: string, tenant?: string) => json<SandboxInfo>(`/v1/sandboxes/${id}/pause`, { method: 'POST', tenant }),
  resume: (id: string, tenant?: string) => json<SandboxInfo>(`/v1/sandboxes/${id}/resume`, { method: 'POST', tenant }),
  kill: (id: string, tenant?: string) => json<SandboxInfo>(`/v1/sandboxes/${id}`, { method: 'DELETE', tenant }),
  keepalive: (id: string, tenant?: string) => json<SandboxInfo>(`/v1/sandboxes/${id}/keepalive`, { method: 'POST', tenant }),
  snapshot: (id: string, tenant?: string) => json<unknown>(`/v1/sandboxes/${id}/snapshots`, { method: 'POST', body: {}, tenant }),
  fork: (id: string, count: number, tenant?: string) => json<unknown>(`/v1/sandboxes/${id}/fork`, { method: 'POST', body: { count }, tenant }),
};
