import { z } from 'zod';
import { Sandbox, Snapshots, type SandboxInfo } from '../sdk/index.js';
import { confirm, given, sandboxId, type ToolDefinition } from './definition.js';

/** Forks one tool call may ask for (the API takes up to 100; an agent rarely needs more). @default 10 */
const MAX_TOOL_FORKS = 10;
/** Changed paths a tool answer lists; the rest are counted and flagged. @default 200 */
const MAX_TOOL_CHANGES = 200;

function created(info: SandboxInfo): Record<string, unknown> {
  return { sandboxId: info.sandboxId, state: info.state, template: info.spec.template, backend: info.spec.backend, expiresAt: info.expiresAt };
}

/** Sandboxes themselves: create (from a template or a snapshot), list, snapshot, fork, changes, kill. */
export const SANDBOX_TOOLS: readonly ToolDefinition[] = [
  {
    name: 'create_sandbox',
    title: 'Create a sandbox',
    description:
      'Start an isolated Linux sandbox (Python 3 and Node available). Returns its sandboxId, needed by every other tool. ' +
      'Start it from a template (template: "name[:tag]") or from a snapshot (snapshot: "snap_..."). ' +
      'No network unless network.mode is "allowlist" (with allow: ["pypi.org", ...]) or "internet" (if the operator permits).',
    inputSchema: {
      template: z.string().optional().describe('Template to start from, "name" or "name:tag" (default: the operator\'s default template)'),
      snapshot: z.string().optional().describe('A snapshot id (snap_...) to start from: its files, with its template'),
      backend: z.enum(['namespace', 'gvisor']).optional().describe('Isolation backend (default namespace)'),
      limits: z
        .object({ memoryBytes: z.number().int().positive().optional(), cpus: z.number().positive().optional(), wallClockMs: z.number().int().positive().optional(), diskBytes: z.number().int().positive().optional() })
        .optional()
        .describe('Resource limits; wallClockMs is the default time limit of each command'),
      network: z
        .object({ mode: z.enum(['none', 'allowlist', 'internet']).optional(), allow: z.array(z.string()).optional(), publicPorts: z.array(z.number().int()).optional() })
        .optional()
        .describe('Outbound network policy, and ports reachable without a token'),
      ttlMs: z.number().int().positive().optional().describe('How long the sandbox lives (default 5 minutes)'),
    },
    mutates: true,
    async run(args, connection, handles) {
      const sandbox = await Sandbox.create(given(args, ['template', 'snapshot', 'backend', 'limits', 'network', 'ttlMs']), connection);
      handles.remember(sandbox, connection);
      return created(sandbox.info);
    },
  },
  {
    name: 'list_sandboxes',
    title: 'List sandboxes',
    description: 'The sandboxes of this API key\'s tenant that are starting, running or paused.',
    inputSchema: {},
    mutates: false,
    async run(_args, connection) {
      const { sandboxes } = await Sandbox.list({ ...connection, state: ['starting', 'running', 'paused'] });
      return { sandboxes: sandboxes.map((info) => ({ sandboxId: info.sandboxId, state: info.state, createdAt: info.createdAt, metadata: info.metadata })) };
    },
  },
  {
    name: 'snapshot_sandbox',
    title: 'Snapshot a sandbox',
    description: 'Save the sandbox\'s files at this instant (its processes go on). create_sandbox with snapshot: snapshotId starts a new sandbox from it; sandbox_changes with since: snapshotId lists what changed after it.',
    inputSchema: {
      sandboxId,
      name: z.string().min(1).max(128).optional().describe('A name to find it by'),
      includeVolumes: z.boolean().optional().describe('Also keep a copy of each volume the sandbox mounts (default false: volumes are not part of a snapshot)'),
    },
    mutates: true,
    async run(args, connection, handles) {
      const sandbox = await handles.get(args.sandboxId, connection);
      const info = await sandbox.snapshot({ ...(typeof args.name === 'string' && { name: args.name }), ...(args.includeVolumes === true && { includeVolumes: true }) });
      const volumes = (info.volumes ?? []).map((v) => ({ name: v.name, path: v.path, included: v.included }));
      return { snapshotId: info.snapshotId, ...(info.name !== undefined && { name: info.name }), sandboxId: info.sandboxId, template: info.template, createdAt: info.createdAt, ...(volumes.length > 0 && { volumes }) };
    },
  },
  {
    name: 'fork_sandbox',
    title: 'Fork a sandbox',
    description: `Make COUNT new sandboxes (1 to ${MAX_TOOL_FORKS}) from one snapshot of this one: each starts with the same files and runs on its own, e.g. to try alternatives side by side. Returns their sandboxIds.`,
    inputSchema: { sandboxId, count: z.number().int().min(1).max(MAX_TOOL_FORKS).optional().describe('How many forks (default 1)') },
    mutates: true,
    async run(args, connection, handles) {
      const sandbox = await handles.get(args.sandboxId, connection);
      const outcome = await sandbox.fork(typeof args.count === 'number' ? args.count : 1);
      const forks = outcome.forks.map((entry) => {
        if ('error' in entry) return { error: { code: entry.error.code, message: entry.error.message, ...(entry.error.hint !== undefined && { hint: entry.error.hint }) } };
        handles.remember(entry.sandbox, connection);
        return created(entry.sandbox.info);
      });
      return { snapshotId: outcome.snapshot.snapshotId, forks };
    },
  },
  {
    name: 'sandbox_changes',
    title: 'What changed in a sandbox',
    description: `Files added, modified and deleted in the sandbox against what it started from (its snapshot or template), or since a snapshot. At most ${MAX_TOOL_CHANGES} paths are listed; truncated says when there are more.`,
    inputSchema: { sandboxId, since: z.string().optional().describe('A snapshot id (snap_...): changes after it') },
    mutates: false,
    async run(args, connection, handles) {
      const sandbox = await handles.get(args.sandboxId, connection);
      const answer = await sandbox.changes(typeof args.since === 'string' ? { since: args.since } : {});
      const changes = answer.changes.slice(0, MAX_TOOL_CHANGES).map((change) => ({ path: change.path, kind: change.kind, type: change.type, sizeBytes: change.sizeBytes }));
      return { origin: answer.origin, changes, total: answer.changes.length, truncated: answer.truncated || answer.changes.length > MAX_TOOL_CHANGES };
    },
  },
  {
    name: 'port_url',
    title: 'URL of a port',
    description: 'A signed URL (valid one hour) that reaches a server listening on PORT inside the sandbox, over HTTP or WebSocket.',
    inputSchema: { sandboxId, port: z.number().int().min(1).max(65_535) },
    mutates: true,
    async run(args, connection, handles) {
      const sandbox = await handles.get(args.sandboxId, connection);
      const signed = await sandbox.portUrl(Number(args.port));
      return { url: signed.hostUrl ?? signed.url, expiresAt: signed.expiresAt };
    },
  },
  {
    name: 'delete_snapshot',
    title: 'Delete a snapshot',
    description: 'Delete a snapshot (from snapshot_sandbox or fork_sandbox) and its data, once no running sandbox was made from it. Needs confirm: true.',
    inputSchema: { snapshotId: z.string().describe('The snapshot id (snap_...)'), confirm: confirm('deleting') },
    mutates: true,
    destructive: true,
    async run(args, connection) {
      await Snapshots.delete(String(args.snapshotId), connection);
      return { snapshotId: args.snapshotId, deleted: true };
    },
  },
  {
    name: 'kill_sandbox',
    title: 'Kill a sandbox',
    description: 'End the sandbox and everything in it; its files are gone (snapshots taken of it stay). Needs confirm: true.',
    inputSchema: { sandboxId, confirm: confirm('killing') },
    mutates: true,
    destructive: true,
    async run(args, connection, handles) {
      const sandbox = await handles.get(args.sandboxId, connection);
      handles.forget(args.sandboxId, connection);
      const info = await sandbox.kill();
      return { sandboxId: info.sandboxId, state: info.state };
    },
  },
];
