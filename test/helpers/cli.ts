import { PassThrough } from 'node:stream';
import { main } from '../../src/cli/main.js';

export interface CliRun {
  code: number;
  stdout: string;
  stderr: string;
}

/** Runs the `capsule` CLI in this process with the given environment and collects its output. */
export async function runCli(argv: string[], env: NodeJS.ProcessEnv): Promise<CliRun> {
  const stdout = new PassThrough();
  const stderr = new PassThrough();
  let out = '';
  let err = '';
  stdout.on('data', (chunk: Buffer) => (out += chunk.toString()));
  stderr.on('data', (chunk: Buffer) => (err += chunk.toString()));
  const code = await main(['node', 'capsule', ...argv], { stdout, stderr, env });
  return { code, stdout: out, stderr: err };
}
