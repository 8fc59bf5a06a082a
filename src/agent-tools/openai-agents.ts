/**
 * Capsule for the OpenAI Agents SDK (`capsule/openai-agents`), on `@openai/agents` (an optional
 * peer dependency). Two ways in:
 *
 * - `CapsuleSandboxClient`: the SDK's own sandbox client interface (`@openai/agents/sandbox`),
 *   so a `SandboxAgent` with the shell and filesystem capabilities runs in a Capsule sandbox.
 * - `capsuleTools()`: function tools for any `Agent` (create, exec, run code, files, snapshot,
 *   fork, changes, kill), the same catalog as the MCP server. A failure throws a ToolCallError
 *   whose message (Capsule's code and hint) the SDK's error function gives the model.
 *
 * ```ts
 * import { capsuleTools } from 'capsule/openai-agents';
 * const agent = new Agent({ name: 'coder', tools: capsuleTools({ apiKey }) });
 * ```
 */
import { tool, type FunctionTool } from '@openai/agents';
import { z } from 'zod';
import { callForAdapter, selectTools, type AdapterOptions } from './index.js';

export { ToolCallError, TOOL_OUTPUT_BYTES, type AdapterOptions, type ToolName } from './index.js';
export { CapsuleSandboxClient, type CapsuleSandboxClientOptions, type CapsuleSnapshotSpec } from './openai-client.js';
export { CapsuleSandboxSession, type CapsuleSandboxSessionState } from './openai-session.js';

/** A non-strict tool takes JSON Schema; its arguments are checked against the zod schema when it runs. */
function jsonParameters(shape: z.ZodRawShape): { type: 'object'; properties: Record<string, never>; required: never[]; additionalProperties: true } {
  const schema = z.toJSONSchema(z.object(shape)) as { properties?: Record<string, never>; required?: never[] };
  return { type: 'object', properties: schema.properties ?? {}, required: schema.required ?? [], additionalProperties: true };
}

/**
 * Capsule's tools as Agents SDK function tools (all of them, or `options.tools`). Not strict:
 * the API's strict mode wants every field required, and most of these are optional.
 */
export function capsuleTools(options: AdapterOptions = {}): FunctionTool[] {
  const { tools, connection, handles } = selectTools(options);
  return tools.map(
    (definition) =>
      tool({
        name: definition.name,
        description: definition.description,
        parameters: jsonParameters(definition.inputSchema),
        strict: false,
        execute: (input: unknown) => callForAdapter(definition, input, connection, handles),
      }) as unknown as FunctionTool,
  );
}
