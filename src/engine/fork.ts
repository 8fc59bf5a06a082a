import { SandboxError } from '../errors/index.js';
import type { SandboxInfo } from '../wire/index.js';

/** Forks made at once: each create is a few btrfs calls and a launcher; two cores gain nothing beyond this. */
const FORK_CONCURRENCY = 4;

export type ForkEntry = { sandbox: SandboxInfo } | { error: { code: string; message: string } };

/** Runs `create` for 0..count-1, a few at a time, and reports each on its own, in order. */
export async function forkAll(count: number, create: (index: number) => Promise<SandboxInfo>): Promise<ForkEntry[]> {
  const entries: ForkEntry[] = new Array<ForkEntry>(count);
  let next = 0;
  const worker = async () => {
    while (next < count) {
      const index = next++;
      try {
        entries[index] = { sandbox: await create(index) };
      } catch (error) {
        const code = error instanceof SandboxError ? error.code : 'INTERNAL';
        entries[index] = { error: { code, message: (error as Error).message } };
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(FORK_CONCURRENCY, count) }, worker));
  return entries;
}
