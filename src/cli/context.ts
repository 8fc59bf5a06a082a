/** What a command writes to and how it reports its exit status; tests pass their own. */
export interface CliContext {
  stdout: NodeJS.WritableStream;
  stderr: NodeJS.WritableStream;
  exitCode: number;
  env: NodeJS.ProcessEnv;
}
