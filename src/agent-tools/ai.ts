/**
 * Capsule's tools for the Vercel AI SDK (`capsule/ai`), on `ai` (an optional peer dependency):
 * a tool set for `generateText` / `streamText`. Each tool answers an object; a failure throws a
 * ToolCallError whose message (Capsule's code and hint) the SDK gives the model as a tool error.
 *
 * ```ts
 * import { capsuleTools } from 'capsule/ai';
 * const result = await generateText({ model, tools: capsuleTools({ apiKey }), stopWhen: stepCountIs(10), prompt });
 * ```
 */
import { tool, type Tool } from 'ai';
import { z } from 'zod';
import { callForAdapter, selectTools, type AdapterOptions } from './index.js';

export { ToolCallError, TOOL_OUTPUT_BYTES, type AdapterOptions, type ToolName } from './index.js';

/** Capsule's tools as an AI SDK tool set, keyed by tool name (all of them, or `options.tools`). */
export function capsuleTools(options: AdapterOptions = {}): Record<string, Tool<Record<string, unknown>, Record<string, unknown>>> {
  const { tools, connection, handles } = selectTools(options);
  return Object.fromEntries(
    tools.map((definition) => [
      definition.name,
      tool<Record<string, unknown>, Record<string, unknown>>({
        title: definition.title,
        description: definition.description,
        inputSchema: z.object(definition.inputSchema) as unknown as z.ZodType<Record<string, unknown>>,
        execute: (input) => callForAdapter(definition, input, connection, handles),
      }),
    ]),
  );
}
