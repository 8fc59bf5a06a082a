import type { ConnectionOptions } from '../sdk/index.js';
import { failureText, runTool, type SandboxHandles, type ToolDefinition } from '../agent-tools/index.js';

/** What a tool answers: text for the model, and the same as structured content. */
export interface ToolAnswer {
  [key: string]: unknown;
  content: { type: 'text'; text: string }[];
  structuredContent?: Record<string, unknown>;
  isError?: boolean;
}

/** Runs a tool; a failure is an MCP error result carrying Capsule's code and hint, never a throw. */
export async function callTool(tool: ToolDefinition, args: Record<string, unknown>, connection: ConnectionOptions, handles: SandboxHandles): Promise<ToolAnswer> {
  const outcome = await runTool(tool, args, connection, handles);
  if (outcome.ok) return { content: [{ type: 'text', text: JSON.stringify(outcome.answer, null, 2) }], structuredContent: outcome.answer };
  return { content: [{ type: 'text', text: failureText(outcome.failure) }], structuredContent: { ...outcome.failure }, isError: true };
}
