import { mkdtempSync, readFileSync, rmSync, statSync, chmodSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { loadTokenKey, tokenKeyPath } from '../../src/host/token-key.host.js';
import { EnvdTokens } from '../../src/server/e2b/access.js';

const dirs: string[] = [];
function dataDir(): string {
  const dir = mkdtempSync(join(tmpdir(), 'capsule-token-key-'));
  dirs.push(dir);
  return dir;
}
afterEach(() => {
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});

describe('the instance token key', () => {
  it('is made once, 0600 in a 0700 directory, and read back the same by the next start', () => {
    const dir = dataDir();
    const first = loadTokenKey(dir);
    expect(first.length).toBe(32);
    expect(statSync(tokenKeyPath(dir)).mode & 0o777).toBe(0o600);
    expect(statSync(join(dir, 'keys')).mode & 0o777).toBe(0o700);
    expect(loadTokenKey(dir).equals(first)).toBe(true);
    expect(readFileSync(tokenKeyPath(dir)).equals(first)).toBe(true);
    // Another data directory, another key.
    expect(loadTokenKey(dataDir()).equals(first)).toBe(false);
  });

  it('keeps an access token valid across two loads (a restart) and not across instances', () => {
    const dir = dataDir();
    const token = new EnvdTokens(loadTokenKey(dir)).issue('tenant-a', 'sbx1');
    expect(new EnvdTokens(loadTokenKey(dir)).tenantOf(token, 'sbx1')).toBe('tenant-a');
    expect(new EnvdTokens(loadTokenKey(dataDir())).tenantOf(token, 'sbx1')).toBeUndefined();
  });

  it('closes a key file left readable by others, and refuses one of the wrong size instead of replacing it', () => {
    const dir = dataDir();
    const key = loadTokenKey(dir);
    chmodSync(tokenKeyPath(dir), 0o644);
    expect(loadTokenKey(dir).equals(key)).toBe(true);
    expect(statSync(tokenKeyPath(dir)).mode & 0o777).toBe(0o600);
    writeFileSync(tokenKeyPath(dir), 'short');
    expect(() => loadTokenKey(dir)).toThrow(/holds 5 bytes, not 32/);
    expect(readFileSync(tokenKeyPath(dir), 'utf8')).toBe('short');
  });
});
