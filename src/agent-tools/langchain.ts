/**
 * Capsule's tools for LangChain JS (`capsule/langchain`), on `@langchain/core` (an optional peer
 * dependency). Each tool answers JSON text; a failure throws a ToolCallError whose message
 * carries Capsule's code and hint, which LangGraph's ToolNode hands to the model.
 *
 * ```ts
 * import { capsuleTools } from 'capsule/langchain';
 * const tools = capsuleTools({ url: 'http://127.0.0.1:7070', apiKey: process.env.CAPSULE_API_KEY });
 * const agent = createAgent({ model, tools });
 * ```
 */
import { tool, type DynamicStructuredTool } from '@langchain/core/tools';
import { z } from 'zod';
import { callForAdapter, selectTools, type AdapterOptions } from './index.js';

export { ToolCallError, TOOL_OUTPUT_BYTES, type AdapterOptions, type ToolName } from './index.js';

/** Capsule's tools as LangChain structured tools (all of them, or `options.tools`). */
export function capsuleTools(options: AdapterOptions = {}): DynamicStructuredTool[] {
  const { tools, connection, handles } = selectTools(options);
  return tools.map(
    (definition) =>
      tool(async (input: Record<string, unknown>) => JSON.stringify(await callForAdapter(definition, input, connection, handles)), {
        name: definition.name,
        description: definition.description,
        schema: z.object(definition.inputSchema),
      }) as unknown as DynamicStructuredTool,
  );
}
