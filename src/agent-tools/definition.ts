import { z } from 'zod';
import type { ConnectionOptions } from '../sdk/index.js';
import type { SandboxHandles } from './handles.js';

/**
 * One tool an agent can call, whatever carries it (MCP, LangChain, the AI SDK, the OpenAI Agents
 * SDK): a name, what the model reads, an input schema with the SDK's argument names, and what
 * it does with the SDK. A surface only translates the shape; every tool behaves the same on all.
 */
export interface ToolDefinition {
  name: string;
  title: string;
  description: string;
  inputSchema: z.ZodRawShape;
  /** Changes something (the MCP hint clients use to ask before calling). */
  mutates: boolean;
  /** Destroys something for good (kill): such a tool takes `confirm: true`. */
  destructive?: boolean;
  run(args: Record<string, unknown>, connection: ConnectionOptions, handles: SandboxHandles): Promise<Record<string, unknown>>;
}

export const sandboxId = z.string().describe('The sandbox id (from create_sandbox, fork_sandbox or list_sandboxes)');
export const command = z
  .union([z.string(), z.array(z.string()).min(1)])
  .describe('A shell command (run as sh -c COMMAND) or an argv array run directly');
export const confirm = (what: string) => z.literal(true).describe(`Must be true: ${what} cannot be undone`);

/** The arguments the caller gave, without the ones left out (the SDK fills its defaults). */
export function given(args: Record<string, unknown>, names: readonly string[]): Record<string, unknown> {
  return Object.fromEntries(names.filter((name) => args[name] !== undefined).map((name) => [name, args[name]]));
}
