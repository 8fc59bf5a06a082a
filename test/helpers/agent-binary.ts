import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const NATIVE = fileURLToPath(new URL('../../native/', import.meta.url));

/** The agent's C sources: the program and the modules it links (users, relays). */
export const AGENT_SOURCES = ['capsule-agent.c', 'agent-users.c', 'agent-relay.c'].map((file) => join(NATIVE, file));

/** Compiles capsule-agent from native/ into `dir` (dynamically linked: it runs on the host here). */
export function buildAgent(dir: string): Promise<string> {
  const target = join(dir, 'capsule-agent');
  return new Promise((resolve, reject) => {
    const child = spawn('gcc', ['-O2', '-Wall', '-Wextra', '-Werror', '-o', target, ...AGENT_SOURCES, '-lutil'], { stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    child.on('error', reject);
    child.on('close', (code) => (code === 0 ? resolve(target) : reject(new Error(`gcc exited ${code}: ${stderr}`))));
  });
}
