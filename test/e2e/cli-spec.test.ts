import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../../src/server/bootstrap.js';
import { runCli, type CliRun } from '../helpers/cli.js';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';
import { startTestServer, type TestServer } from './server-helpers.js';

/**
 * Every spec field is reachable from `capsule run` and `capsule sandbox create`: the common ones
 * as flags, the rest through --spec FILE.json, the flags merged over the file field by field, and
 * the result validated as the API validates it (INVALID_SPEC naming the field).
 */
const MiB = 1024 * 1024;
const CLI = join(import.meta.dirname, '..', '..', 'bin', 'capsule.js');

let t: TestServer;
let server: RunningServer;
let env: NodeJS.ProcessEnv;
let scratch: string;

beforeAll(async () => {
  scratch = await mkdtemp(join(testDataDir(), 'cli-spec-'));
  t = await startTestServer();
  server = t.server;
  env = { CAPSULE_URL: t.url, CAPSULE_API_KEY: t.apiKey };
});
afterAll(async () => {
  await server?.close();
  await rm(scratch, { recursive: true, force: true });
});
afterEach(expectNoLeaks);

let files = 0;
/** Writes `content` (JSON unless a string) to a fresh file and returns its path. */
async function specFile(content: unknown): Promise<string> {
  const path = join(scratch, `spec-${files++}.json`);
  await writeFile(path, typeof content === 'string' ? content : JSON.stringify(content));
  return path;
}

function run(...argv: string[]): Promise<CliRun> {
  return runCli(['run', '--data-dir', testDataDir(), ...argv], env);
}

function capsule(...argv: string[]): Promise<CliRun> {
  return runCli(argv, env);
}

interface WireError {
  code: string;
  message: string;
  details?: { issues?: { field: string; message: string }[] };
}

/** The one JSON error a failed --json call prints, with exit status 2 (bad flags or spec). */
function usageError(r: CliRun): WireError {
  expect(r.code, r.stderr).toBe(2);
  const lines = r.stdout.trim().split('\n');
  expect(lines, 'exactly one JSON line').toHaveLength(1);
  return (JSON.parse(lines[0]!) as { error: WireError }).error;
}

function fields(error: WireError): string[] {
  return (error.details?.issues ?? []).map((issue) => issue.field);
}

describe('capsule run: flags and --spec FILE', () => {
  it('takes fields without a flag from the file, and the explicit flags over it field by field', async () => {
    const file = await specFile({ limits: { tmpBytes: 8 * MiB, wallClockMs: 500 }, env: { FROM_FILE: 'file', BOTH: 'file' } });
    const script = 'echo $FROM_FILE $BOTH; df -k /tmp | awk \'NR == 2 { print $2 }\'';
    const merged = await run('--spec', file, '--env', 'BOTH=flag', '--timeout', '20s', '--json', '--', 'sh', '-c', script);
    expect(merged.code, merged.stderr).toBe(0);
    // limits.tmpBytes (no flag) came from the file; env merged key by key, the flag winning.
    expect((JSON.parse(merged.stdout) as { stdout: string }).stdout).toBe('file flag\n8192\n');

    // The file's wall clock stands where no flag replaces it ...
    const fromFile = await run('--spec', file, '--json', '--', 'sleep', '30');
    expect(fromFile.code).toBe(124);
    expect(JSON.parse(fromFile.stdout)).toMatchObject({ outcome: 'limit_exceeded', limit: { resource: 'wall_clock' } });
    // ... and --timeout replaces it.
    const overridden = await run('--spec', file, '--timeout', '20s', '--', 'sleep', '1');
    expect(overridden.code, overridden.stderr).toBe(0);
  });

  it('reads the spec from stdin with --spec - (bin/capsule.js, built dist)', async () => {
    const child = spawn(process.execPath, [CLI, 'run', '--data-dir', testDataDir(), '--spec', '-', '--json', '--', 'sh', '-c', 'echo $PIPED'], {
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    child.stdin.end(JSON.stringify({ env: { PIPED: 'yes' } }));
    const code = await new Promise<number | null>((resolve) => child.once('close', resolve));
    expect(code, stderr).toBe(0);
    expect(JSON.parse(stdout)).toMatchObject({ outcome: 'ok', stdout: 'yes\n' });
  });

  it('--backend gvisor runs the command under gVisor (its own kernel), the default on the host kernel', async () => {
    const hostKernel = readFileSync('/proc/version', 'utf8');
    const namespace = await run('--json', '--', 'cat', '/proc/version');
    expect(JSON.parse(namespace.stdout)).toMatchObject({ outcome: 'ok', stdout: hostKernel });
    const gvisor = await run('--backend', 'gvisor', '--json', '--', 'cat', '/proc/version');
    const result = JSON.parse(gvisor.stdout) as { outcome: string; stdout: string };
    expect(result.outcome, gvisor.stderr).toBe('ok');
    expect(result.stdout).toMatch(/^Linux version /);
    expect(result.stdout).not.toBe(hostKernel);
  });

  it('answers a bad spec with INVALID_SPEC naming the field, from the file or from a flag', async () => {
    expect(fields(usageError(await run('--spec', await specFile({ limits: { memoryBytes: 'big' } }), '--json', '--', 'true')))).toEqual(['limits.memoryBytes']);
    expect(fields(usageError(await run('--backend', 'vm', '--json', '--', 'true')))).toEqual(['backend']);
    expect(fields(usageError(await run('--network', 'wide', '--json', '--', 'true')))).toEqual(['network.mode']);
    const notJson = usageError(await run('--spec', await specFile('{"limits": '), '--json', '--', 'true'));
    expect(notJson).toMatchObject({ code: 'INVALID_SPEC' });
    expect(notJson.message).toMatch(/is not JSON/);
    expect(fields(usageError(await run('--spec', await specFile([1, 2]), '--json', '--', 'true')))).toEqual(['(root)']);

    const missing = await run('--spec', join(scratch, 'no-such.json'), '--json', '--', 'true');
    expect(usageError(missing)).toMatchObject({ code: 'INVALID_ARGUMENT', message: expect.stringMatching(/--spec: cannot read .*no-such\.json \(ENOENT\)/) as unknown });
    // People read the same on stderr, with the hint.
    const plain = await run('--backend', 'vm', '--', 'true');
    expect(plain.stderr).toMatch(/^capsule: INVALID_SPEC: invalid sandbox spec: backend: .*\n {2}hint: /);
  });

  it('names an unknown template with TEMPLATE_NOT_FOUND and the list command, from --template and from a --spec file', async () => {
    for (const r of [await run('--template', 'python-data', '--json', '--', 'true'), await run('--spec', await specFile({ template: 'python-data' }), '--json', '--', 'true')]) {
      expect(r.code).toBe(66);
      expect(JSON.parse(r.stdout)).toMatchObject({ error: { code: 'TEMPLATE_NOT_FOUND', hint: expect.stringContaining('capsule template ls') as unknown } });
    }
  });
});

describe('capsule sandbox create: flags and --spec FILE, validated by the server', () => {
  it('creates the merged spec: the file for what has no flag, the flags over it', async () => {
    const file = await specFile({
      backend: 'namespace',
      limits: { tmpBytes: 8 * MiB, memoryBytes: 128 * MiB, openFiles: 256 },
      env: { A: 'file', B: 'file' },
      onTimeout: 'pause',
    });
    const created = await capsule('sandbox', 'create', '--spec', file, '--backend', 'gvisor', '--memory', '256MiB', '--env', 'B=flag', '--timeout', '1m', '--json');
    expect(created.code, created.stderr).toBe(0);
    const { sandboxId } = JSON.parse(created.stdout) as { sandboxId: string };
    try {
      const got = await capsule('sandbox', 'get', sandboxId, '--json');
      expect(JSON.parse(got.stdout)).toMatchObject({
        backend: 'gvisor',
        spec: {
          backend: 'gvisor',
          limits: { tmpBytes: 8 * MiB, memoryBytes: 256 * MiB, openFiles: 256 },
          env: { A: 'file', B: 'flag' },
          onTimeout: 'pause',
          ttlMs: 60_000,
        },
      });
    } finally {
      await capsule('sandbox', 'kill', sandboxId);
    }
  });

  it('fails as the API does for the same spec: INVALID_SPEC with the same issues, exit 2', async () => {
    const spec = { limits: { memoryBytes: 'big', pids: 1 }, network: { mode: 'wide' } };
    const api = await t.json<WireError>('POST', '/v1/sandboxes', { body: { spec } });
    expect(api.status).toBe(422);
    const cli = usageError(await capsule('sandbox', 'create', '--spec', await specFile(spec), '--json'));
    expect(cli.code).toBe(api.body.code);
    expect(cli.code).toBe('INVALID_SPEC');
    expect(cli.details?.issues).toEqual(api.body.details?.issues);
    expect(fields(cli)).toEqual(expect.arrayContaining(['limits.memoryBytes', 'limits.pids', 'network.mode']));
  });

  it('passes --template to the server, which names an unknown one with TEMPLATE_NOT_FOUND', async () => {
    const r = await capsule('sandbox', 'create', '--template', 'python-data', '--json');
    expect(r.code).toBe(66);
    expect(JSON.parse(r.stdout)).toMatchObject({ error: { code: 'TEMPLATE_NOT_FOUND' } });
  });
});
