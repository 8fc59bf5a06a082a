import { randomBytes } from 'node:crypto';

/** Sandbox ids are 20 lowercase base-32 characters: safe in paths, cgroup names and URLs. */
export function newSandboxId(): string {
  const alphabet = 'abcdefghijklmnopqrstuvwxyz234567';
  const bytes = randomBytes(20);
  let id = '';
  for (const byte of bytes) id += alphabet[byte & 31];
  return id;
}
