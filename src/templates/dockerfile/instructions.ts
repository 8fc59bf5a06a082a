import { readFile } from 'node:fs/promises';
import { basename, isAbsolute, join } from 'node:path';
import { SandboxError } from '../../errors/index.js';
import { parseDockerfile, type Instruction } from './parse.js';

/** A build's instructions: given (with `dockerfile` naming them in messages), or parsed from the Dockerfile's text or file. */
export async function buildInstructions(
  contextDir: string,
  options: { instructions?: Instruction[]; dockerfile?: string; dockerfileText?: string; allowHostPaths?: boolean },
): Promise<{ file: string; instructions: Instruction[] }> {
  if (options.instructions) return { file: options.dockerfile ?? 'steps', instructions: options.instructions };
  const dockerfilePath = dockerfileIn(contextDir, options.dockerfile, options.allowHostPaths ?? false);
  const file = basename(dockerfilePath);
  const text = options.dockerfileText ?? (await readFile(dockerfilePath, 'utf8').catch(() => undefined));
  if (text === undefined) throw new SandboxError('INVALID_ARGUMENT', `cannot read the Dockerfile ${dockerfilePath}`, { details: { file: dockerfilePath } });
  return { file, instructions: parseDockerfile(text, { file }) };
}

/** The Dockerfile's path: inside the context (no `..`, not absolute) unless host paths are allowed. */
function dockerfileIn(contextDir: string, dockerfile: string | undefined, allowHostPaths: boolean): string {
  if (dockerfile === undefined) return join(contextDir, 'Dockerfile');
  if (allowHostPaths) return isAbsolute(dockerfile) ? dockerfile : join(contextDir, dockerfile);
  if (isAbsolute(dockerfile) || dockerfile.split(/[\\/]/).includes('..')) {
    throw new SandboxError('INVALID_ARGUMENT', `the Dockerfile "${dockerfile}" is outside the build context`, {
      details: { field: 'dockerfile', value: dockerfile },
      hint: 'Name a Dockerfile inside the context (a relative path without ".."), or pass its text.',
    });
  }
  return join(contextDir, dockerfile);
}
