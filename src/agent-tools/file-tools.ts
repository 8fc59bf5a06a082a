import { z } from 'zod';
import { sandboxId, type ToolDefinition } from './definition.js';
import { capped, TOOL_OUTPUT_BYTES } from './output.js';

/** Entries one list_files answer holds. @default 1000 */
const MAX_LISTED = 1000;

/** Text files in the sandbox: write, read (capped), list. */
export const FILE_TOOLS: readonly ToolDefinition[] = [
  {
    name: 'write_file',
    title: 'Write a file',
    description: 'Create or replace a text file in the sandbox (relative paths are under /workspace; parent directories are made).',
    inputSchema: { sandboxId, path: z.string(), content: z.string() },
    mutates: true,
    async run(args, connection, handles) {
      const sandbox = await handles.get(args.sandboxId, connection);
      const entry = await sandbox.files.write(String(args.path), String(args.content));
      return { path: entry.path, size: entry.size };
    },
  },
  {
    name: 'read_file',
    title: 'Read a file',
    description: `Read a text file from the sandbox (at most ${TOOL_OUTPUT_BYTES} bytes are returned; truncated says when more exists).`,
    inputSchema: { sandboxId, path: z.string() },
    mutates: false,
    async run(args, connection, handles) {
      const sandbox = await handles.get(args.sandboxId, connection);
      const content = capped(await sandbox.files.read(String(args.path)));
      return { path: args.path, content: content.text, truncated: content.truncated };
    },
  },
  {
    name: 'list_files',
    title: 'List a directory',
    description: `Entries of a directory in the sandbox (path, type, size), optionally several levels deep; at most ${MAX_LISTED}.`,
    inputSchema: { sandboxId, path: z.string().optional().describe('Default /workspace'), depth: z.number().int().min(1).max(10).optional() },
    mutates: false,
    async run(args, connection, handles) {
      const sandbox = await handles.get(args.sandboxId, connection);
      const entries = await sandbox.files.list(typeof args.path === 'string' ? args.path : '/workspace', typeof args.depth === 'number' ? { depth: args.depth } : {});
      return { entries: entries.slice(0, MAX_LISTED).map((e) => ({ path: e.path, type: e.type, size: e.size })), truncated: entries.length > MAX_LISTED };
    },
  },
];
