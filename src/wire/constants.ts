/**
 * The wire contract's enumerations that clients need as values: kept apart from the schemas so
 * that a client (the CLI's client commands, the SDK) can use them without loading zod.
 */

/** Languages an interpreter context can run. `ts` is TypeScript with its types stripped. */
export const INTERPRETER_LANGUAGES = ['python', 'js', 'ts'] as const;
