import { createHash } from 'node:crypto';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { Artifacts, NotFoundError, Sandbox, type DeliveredArtifact } from '../../src/sdk/index.js';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';
import { startTestServer, type TestServer } from './server-helpers.js';
import { runCli, type CliRun } from '../helpers/cli.js';

/** Artifacts and usage metrics through the SDK and the CLI (in-process) against a real server. */
let t: TestServer;
let scratch: string;
let env: NodeJS.ProcessEnv;
let connection: { url: string; apiKey: string };

beforeAll(async () => {
  scratch = await mkdtemp(join(testDataDir(), 'cli-artifacts-'));
  t = await startTestServer();
  connection = { url: t.url, apiKey: t.apiKey };
  env = { CAPSULE_URL: t.url, CAPSULE_API_KEY: t.apiKey };
});
afterAll(async () => {
  await t.server.close();
  await rm(scratch, { recursive: true, force: true });
});
afterEach(expectNoLeaks);

function capsule(...argv: string[]): Promise<CliRun> {
  return runCli(argv, env);
}

async function json<T>(...argv: string[]): Promise<T> {
  const r = await capsule(...argv, '--json');
  expect(r.code, `capsule ${argv.join(' ')}: ${r.stderr}`).toBe(0);
  return JSON.parse(r.stdout) as T;
}

const sha = (data: string): string => createHash('sha256').update(data).digest('hex');

describe('SDK: artifacts and metrics', () => {
  it('collects, lists and downloads by sha256, and reads usage samples', async () => {
    const sandbox = await Sandbox.create({}, connection);
    try {
      await sandbox.files.write('output/result.txt', 'forty-two\n');
      const collection = await sandbox.artifacts.collect();
      expect(collection.truncated).toBe(false);
      const ref = collection.artifacts[0] as DeliveredArtifact;
      expect(ref).toMatchObject({ name: 'result.txt', size: 10, sha256: sha('forty-two\n') });
      expect(new TextDecoder().decode(await sandbox.artifacts.download(ref.sha256))).toBe('forty-two\n');
      expect(new TextDecoder().decode(await Artifacts.download(ref.uri, connection))).toBe('forty-two\n');
      expect((await sandbox.artifacts.list()).map((a) => a.sha256)).toEqual([ref.sha256]);

      const samples = await sandbox.getMetrics();
      expect(samples.length).toBeGreaterThanOrEqual(1);
      expect(samples.at(-1)).toMatchObject({ memoryBytes: expect.any(Number) as unknown, cpuUsedPct: expect.any(Number) as unknown });

      await sandbox.kill();
      await Artifacts.delete(ref.sha256, connection);
      await expect(Artifacts.download(ref.sha256, connection)).rejects.toBeInstanceOf(NotFoundError);
    } finally {
      await sandbox.kill().catch(() => undefined);
    }
  });
});

describe('CLI: capsule artifacts, capsule sandbox metrics', () => {
  it('collect, list, get --out, get to stdout, delete, and sandbox metrics', async () => {
    const sandbox = await Sandbox.create({}, connection);
    try {
      await sandbox.files.write('/workspace/out/a.txt', 'alpha');
      const collected = await json<{ artifacts: DeliveredArtifact[]; truncated: boolean }>('artifacts', 'collect', sandbox.sandboxId, '--dir', '/workspace/out');
      expect(collected.artifacts).toEqual([expect.objectContaining({ name: 'a.txt', sha256: sha('alpha') })]);
      const listed = await json<{ artifacts: { sha256: string }[] }>('artifacts', 'list', sandbox.sandboxId);
      expect(listed.artifacts.map((a) => a.sha256)).toEqual([sha('alpha')]);

      const out = join(scratch, 'a.txt');
      expect(await json('artifacts', 'get', sha('alpha'), '--out', out)).toEqual({ path: out, size: 5, sha256: sha('alpha') });
      expect(await readFile(out, 'utf8')).toBe('alpha');
      const toStdout = await capsule('artifacts', 'get', sha('alpha'));
      expect(toStdout).toMatchObject({ code: 0, stdout: 'alpha' });

      const metrics = await json<{ samples: unknown[] }>('sandbox', 'metrics', sandbox.sandboxId);
      expect(metrics.samples.length).toBeGreaterThanOrEqual(1);
      const table = await capsule('sandbox', 'metrics', sandbox.sandboxId);
      expect(table.code).toBe(0);
      expect(table.stdout).toMatch(/^timestamp/);

      expect(await json('artifacts', 'delete', sha('alpha'))).toEqual({ deleted: sha('alpha') });
      const gone = await capsule('artifacts', 'get', sha('alpha'), '--json');
      expect(gone.code).not.toBe(0);
      expect(gone.stdout + gone.stderr).toContain('NOT_FOUND');
    } finally {
      await sandbox.kill();
    }
  });
});
