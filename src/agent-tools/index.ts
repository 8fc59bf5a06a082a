/**
 * Capsule's tools for agents, one catalog on the TypeScript SDK: the MCP server (src/mcp) and
 * the framework adapters (`capsule/langchain`, `capsule/ai`, `capsule/openai-agents`) carry the
 * same tools, with the SDK's argument names, the same caps on output and the same errors.
 */
import { z } from 'zod';
import { SandboxError, type ErrorCode } from '../errors/index.js';
import { CapsuleError, type ConnectionOptions } from '../sdk/index.js';
import { COMMAND_TOOLS } from './command-tools.js';
import type { ToolDefinition } from './definition.js';
import { FILE_TOOLS } from './file-tools.js';
import { SandboxHandles } from './handles.js';
import { SANDBOX_TOOLS } from './sandbox-tools.js';

export type { ToolDefinition } from './definition.js';
export { SandboxHandles } from './handles.js';
export { TOOL_OUTPUT_BYTES } from './output.js';

/** Every tool, in the order an agent meets them. */
export const TOOLS: readonly ToolDefinition[] = [...SANDBOX_TOOLS.slice(0, 1), ...COMMAND_TOOLS, ...FILE_TOOLS, ...SANDBOX_TOOLS.slice(1)];

/** Each catalog tool's argument schema, built once (unknown arguments are errors). */
const SCHEMAS: ReadonlyMap<ToolDefinition, z.ZodObject> = new Map(TOOLS.map((tool) => [tool, z.strictObject(tool.inputSchema)]));

/** The zod schema of a tool's arguments. */
export function schemaOf(tool: ToolDefinition): z.ZodObject {
  return SCHEMAS.get(tool) ?? z.strictObject(tool.inputSchema);
}

/** A tool's name (`create_sandbox`, `exec`, …). */
export type ToolName = string;

/** What a failed tool call tells the model: Capsule's stable code, what happened, what to do. */
export interface ToolFailure {
  code: ErrorCode;
  message: string;
  hint?: string;
  requestId?: string;
}

/** The model-readable form of a failure: `CODE: message` and a `Hint:` line. */
export function failureText(failure: ToolFailure): string {
  return `${failure.code}: ${failure.message}${failure.hint !== undefined ? `\nHint: ${failure.hint}` : ''}`;
}

/**
 * A tool call that failed, as the adapters throw it: the frameworks hand a tool's error message
 * to the model (LangChain's ToolNode, the AI SDK's tool-error part, the Agents SDK's error
 * function), so the message carries the code and the hint.
 */
export class ToolCallError extends Error {
  readonly code: ErrorCode;
  readonly hint: string | undefined;
  readonly requestId: string | undefined;

  constructor(
    readonly failure: ToolFailure,
    options: { cause?: unknown } = {},
  ) {
    super(failureText(failure), options);
    this.name = 'ToolCallError';
    this.code = failure.code;
    this.hint = failure.hint;
    this.requestId = failure.requestId;
  }
}

export type ToolOutcome = { ok: true; answer: Record<string, unknown> } | { ok: false; failure: ToolFailure; error: unknown };

/**
 * Runs one tool: checks the arguments against its schema (a framework that calls `execute`
 * directly skips its own check; a destructive tool never runs without `confirm: true`), then
 * calls the SDK. Never throws: a failure comes back with Capsule's code and hint.
 */
export async function runTool(tool: ToolDefinition, args: unknown, connection: ConnectionOptions, handles: SandboxHandles): Promise<ToolOutcome> {
  const parsed = schemaOf(tool).safeParse(args ?? {});
  if (!parsed.success) {
    const problems = parsed.error.issues.map((issue) => `${issue.path.join('.') || '(arguments)'}: ${issue.message}`).join('; ');
    return {
      ok: false,
      error: parsed.error,
      failure: { code: 'INVALID_ARGUMENT', message: `invalid arguments for ${tool.name}: ${problems}`, hint: `Call ${tool.name} with the arguments its schema names${tool.destructive === true ? ' (confirm: true is required)' : ''}.` },
    };
  }
  try {
    return { ok: true, answer: await tool.run(parsed.data, connection, handles) };
  } catch (error) {
    return { ok: false, error, failure: failureOf(error) };
  }
}

/** Runs a tool for an adapter: its answer, or a ToolCallError. */
export async function callForAdapter(tool: ToolDefinition, args: unknown, connection: ConnectionOptions, handles: SandboxHandles): Promise<Record<string, unknown>> {
  const outcome = await runTool(tool, args, connection, handles);
  if (outcome.ok) return outcome.answer;
  throw new ToolCallError(outcome.failure, { cause: outcome.error });
}

function failureOf(error: unknown): ToolFailure {
  if (error instanceof SandboxError) {
    return { code: error.code, message: error.message, ...(error.hint !== undefined && { hint: error.hint }), ...(error instanceof CapsuleError && error.requestId !== undefined && { requestId: error.requestId }) };
  }
  return { code: 'INTERNAL', message: error instanceof Error ? error.message : String(error), hint: 'Retry; if it persists, report it with the server log.' };
}

/** What every adapter takes: where the server is, and which tools to offer. */
export interface AdapterOptions extends ConnectionOptions {
  /** Only these tools. @default every tool */
  tools?: readonly ToolName[];
  /** Sandbox handles shared between tool sets. @default a new set */
  handles?: SandboxHandles;
}

/** The tools an adapter offers, and the state they share. */
export function selectTools(options: AdapterOptions): { tools: ToolDefinition[]; connection: ConnectionOptions; handles: SandboxHandles } {
  const { tools: names, handles = new SandboxHandles(), ...connection } = options;
  const unknown = (names ?? []).filter((name) => !TOOLS.some((tool) => tool.name === name));
  if (unknown.length > 0) throw new SandboxError('INVALID_ARGUMENT', `unknown Capsule tools: ${unknown.join(', ')}`, { hint: `Choose among ${TOOLS.map((tool) => tool.name).join(', ')}.` });
  return { tools: TOOLS.filter((tool) => names === undefined || names.includes(tool.name)), connection, handles };
}
