import { afterEach, describe, expect, it } from 'vitest';
import { expectNoLeaks } from '../helpers/sandbox.js';
import { runCli, type CliRun } from '../helpers/cli.js';
import { startTestServer } from './server-helpers.js';

/** `capsule sandbox snapshot|fork|changes`, `snapshot ls|rm`, `volume create|ls|rm`, `--from-snapshot`, `--volume` against a real server. */
afterEach(expectNoLeaks);

describe('capsule snapshots and volumes', () => {
  it('drive a snapshot, a fork, changes and a volume from the CLI', async () => {
    const t = await startTestServer();
    const env = { CAPSULE_URL: t.url, CAPSULE_API_KEY: t.apiKey };
    const cli = async (...argv: string[]): Promise<CliRun> => {
      const run = await runCli(argv, env);
      expect(run.code, `capsule ${argv.join(' ')}: ${run.stderr}`).toBe(0);
      return run;
    };
    const ids: string[] = [];
    try {
      expect((await cli('volume', 'create', 'cache', '--size', '16MiB')).stdout).toBe('cache\n');
      expect((await cli('volume', 'ls')).stdout).toMatch(/^cache\s+\S+ \/\s+16777216\n$/);
      const id = (await cli('sandbox', 'create', '--volume', 'cache:/cache', '--timeout', '2m')).stdout.trim();
      ids.push(id);
      await cli('sandbox', 'exec', id, '--', '/bin/sh', '-c', 'echo v > /cache/v && echo w > /workspace/w');
      const snapshotId = (await cli('sandbox', 'snapshot', id, '--name', 'cli')).stdout.trim();
      expect(snapshotId).toMatch(/^snap_/);
      expect((await cli('snapshot', 'ls')).stdout).toContain(`${snapshotId}`);
      const restored = (await cli('sandbox', 'create', '--from-snapshot', snapshotId)).stdout.trim();
      ids.push(restored);
      expect((await cli('sandbox', 'exec', restored, '--', 'cat', '/workspace/w')).stdout).toBe('w\n');
      await cli('sandbox', 'exec', restored, '--', '/bin/sh', '-c', 'echo new > /workspace/new');
      expect((await cli('sandbox', 'changes', restored)).stdout).toMatch(/^A file\s+4 {2}\/workspace\/new\n$/);
      const forks = (await cli('sandbox', 'fork', restored, '--count', '2')).stdout.trim().split('\n');
      expect(forks).toHaveLength(2);
      ids.push(...forks);
      // The namespace backend keeps no processes in a snapshot: refused by code, nothing made.
      const full = await runCli(['sandbox', 'fork', restored, '--count', '1', '--mode', 'full'], env);
      expect(full.code).not.toBe(0);
      expect(full.stderr).toContain('BACKEND_CANNOT_ENFORCE');
      const badMode = await runCli(['sandbox', 'fork', restored, '--count', '1', '--mode', 'memory'], env);
      expect(badMode.code).not.toBe(0);
      expect(badMode.stderr).toContain('filesystem');
      const badVolume = await runCli(['sandbox', 'create', '--volume', 'cache'], env);
      expect(badVolume.code).not.toBe(0);
      expect(badVolume.stderr).toContain('NAME:/path');
      // A snapshot that keeps its volume, and a volume made of that copy.
      const withVolume = (await cli('sandbox', 'snapshot', id, '--include-volumes')).stdout.trim();
      expect((await cli('volume', 'create', 'cache-then', '--from', `${withVolume}:cache`)).stdout).toBe('cache-then\n');
      const reader = (await cli('sandbox', 'create', '--volume', 'cache-then:/then:ro', '--timeout', '2m')).stdout.trim();
      ids.push(reader);
      expect((await cli('sandbox', 'exec', reader, '--', 'cat', '/then/v')).stdout).toBe('v\n');
      const noSize = await runCli(['volume', 'create', 'nothing'], env);
      expect(noSize.code).not.toBe(0);
      expect(noSize.stderr).toMatch(/--size/);
      const badFrom = await runCli(['volume', 'create', 'nothing', '--from', withVolume], env);
      expect(badFrom.code).not.toBe(0);
      expect(badFrom.stderr).toContain('SNAPSHOT:VOLUME');
    } finally {
      for (const id of ids) await runCli(['sandbox', 'kill', id], env);
      const left = JSON.parse((await runCli(['snapshot', 'ls', '--json'], env)).stdout) as { snapshots: { snapshotId: string }[] };
      for (const s of left.snapshots) await cli('snapshot', 'rm', s.snapshotId);
      for (const name of ['cache', 'cache-then']) await runCli(['volume', 'rm', name], env);
      await t.server.close();
    }
  }, 120_000);
});
