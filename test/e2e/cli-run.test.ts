import { spawn } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile, chmod } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';

/** The package's `capsule` command: `capsule run` starts from the CLI's startup snapshot. */
const COMMAND = join(import.meta.dirname, '..', '..', 'bin', 'capsule');
/** The same CLI loaded module by module (`node bin/capsule.js`), no snapshot. */
const MODULES = join(import.meta.dirname, '..', '..', 'bin', 'capsule.js');

interface CliResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

function capsule(args: string[], env: NodeJS.ProcessEnv = {}, how: 'command' | 'modules' = 'command'): Promise<CliResult> {
  return new Promise((resolve, reject) => {
    const [file, argv] = how === 'command' ? [COMMAND, args] : [process.execPath, [MODULES, ...args]];
    const child = spawn(file, argv, { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
    child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
    child.once('error', reject);
    child.once('close', (code) => resolve({ code, stdout, stderr }));
  });
}

const run = (...args: string[]): Promise<CliResult> => capsule(['run', '--data-dir', testDataDir(), ...args]);
const TRACE = { CAPSULE_TRACE_STARTUP: '1' };
const FROM_SNAPSHOT = 'capsule: started from the startup snapshot\n';

afterEach(expectNoLeaks);

describe('the capsule command starts `capsule run` from its startup snapshot', () => {
  it('runs from the snapshot and answers as the module-by-module CLI does', async () => {
    const argv = ['run', '--data-dir', testDataDir(), '--', 'sh', '-c', 'echo out; echo err >&2; exit 7'];
    const fromSnapshot = await capsule(argv, TRACE);
    const fromModules = await capsule(argv, TRACE, 'modules');
    expect(fromSnapshot.stderr.startsWith(FROM_SNAPSHOT)).toBe(true);
    expect(fromModules.stderr).not.toContain(FROM_SNAPSHOT);
    expect([fromSnapshot.code, fromSnapshot.stdout]).toEqual([7, 'out\n']);
    expect([fromModules.code, fromModules.stdout]).toEqual([7, 'out\n']);
    const summary = (r: CliResult) => r.stderr.replace(FROM_SNAPSHOT, '').replace(/\d+ ms, peak memory .*/, '');
    expect(summary(fromSnapshot)).toBe(summary(fromModules));
  });

  it('takes nothing of the build into a run: each run has its own sandbox id and environment', async () => {
    const once = () => run('--json', '--', 'true');
    const [first, second] = [await once(), await once()];
    const ids = [first, second].map((r) => (JSON.parse(r.stdout) as { sandboxId: string }).sandboxId);
    expect(ids[0]).not.toBe(ids[1]);
    // The CLI's own environment is read when it runs (the trace switch is one such read).
    expect((await run('--', 'true')).stderr).not.toContain(FROM_SNAPSHOT);
    expect((await capsule(['run', '--data-dir', testDataDir(), '--', 'true'], TRACE)).stderr).toContain(FROM_SNAPSHOT);
  });

  it('loads what a networked run needs when it runs: the egress proxy answers from the snapshot', async () => {
    // The proxy refuses the request itself (a documentation address, outside the allowlist).
    const r = await capsule(['run', '--data-dir', testDataDir(), '--network', 'allowlist', '--allow', '203.0.113.0/24', '--', 'curl', '-s', 'http://198.51.100.7/'], TRACE);
    expect(r.stderr.startsWith(FROM_SNAPSHOT)).toBe(true);
    expect(r.code, r.stderr).toBe(0);
    expect(JSON.parse(r.stdout)).toMatchObject({ code: 'EGRESS_NOT_ALLOWED', destination: '198.51.100.7:80' });
  });

  it('sends every other command to bin/capsule.js', async () => {
    const version = await capsule(['--version'], TRACE);
    expect(version.code).toBe(0);
    expect(version.stdout).toMatch(/^\d+\.\d+\.\d+\n$/);
    const help = await capsule(['sandbox', '--help'], TRACE);
    expect(help.code).toBe(0);
    expect(help.stdout).toContain('Usage: capsule sandbox');
    expect(version.stderr + help.stderr).not.toContain(FROM_SNAPSHOT);
  });
});

describe('capsule run (CLI over the real engine)', () => {
  it('streams output, prints a one-line summary, and mirrors the exit code', async () => {
    const r = await run('--', 'sh', '-c', 'echo out; echo err >&2; exit 7');
    expect(r.code).toBe(7);
    expect(r.stdout).toBe('out\n');
    expect(r.stderr).toMatch(/^err\ncapsule: exit 7 in \d+ ms, peak memory/);
  });

  it('prints exactly one JSON object with --json', async () => {
    const r = await run('--json', '--env', 'GREETING=hi', '--', 'sh', '-c', 'echo $GREETING');
    expect(r.code).toBe(0);
    const result = JSON.parse(r.stdout) as { outcome: string; stdout: string; sandboxId: string };
    expect(result).toMatchObject({ outcome: 'ok', stdout: 'hi\n' });
    expect(result.sandboxId).toMatch(/^[a-z2-7]{20}$/);
  });

  it('exits 124 on the wall clock with a readable summary', async () => {
    const r = await run('--timeout', '500ms', '--', 'sleep', '30');
    expect(r.code).toBe(124);
    expect(r.stderr).toMatch(/capsule: limit exceeded \(wall_clock\): wall-clock limit 500 ms exceeded/);
  });

  it('exits 201 on the memory limit', async () => {
    const r = await run('--memory', '64MiB', '--json', '--', 'python3', '-c', 'x = bytearray(200 * 1024 * 1024)');
    expect(r.code).toBe(201);
    expect((JSON.parse(r.stdout) as { limit: { resource: string } }).limit.resource).toBe('memory');
  });

  it('rejects a bad flag naming it, with exit 2', async () => {
    const r = await run('--memory', 'lots', '--', 'true');
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/--memory: cannot read "lots" as a size/);
  });

  it('refuses limits above the operator maximum with exit 2', async () => {
    const r = await run('--cpus', '8', '--', 'true');
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/SPEC_EXCEEDS_MAXIMUM: limits.cpus is 8, above the operator maximum 2/);
  });

  it('exits 127 when the command does not exist in the sandbox', async () => {
    const r = await run('--', 'no-such-tool');
    expect(r.code).toBe(127);
    expect(r.stderr).toMatch(/EXEC_FAILED|no-such-tool/);
  });

  it('runs the README CSV scenario: read-only input, collected output', async () => {
    const out = await mkdtemp(join(tmpdir(), 'capsule-cli-out-'));
    try {
      const input = join(import.meta.dirname, '..', '..', 'examples', 'csv-demo', 'input');
      const r = await run('--input', input, '--output', out, '--timeout', '10s', '--json', '--', 'python3', '/input/test_convert.py');
      expect(r.code, r.stderr).toBe(0);
      expect(JSON.parse(r.stdout)).toMatchObject({ outcome: 'ok', stdout: '3 checks passed\n' });
      const summary = JSON.parse(await readFile(join(out, 'sales.json'), 'utf8')) as Record<string, { units: number }>;
      expect(summary.north?.units).toBe(13);
    } finally {
      await rm(out, { recursive: true, force: true });
    }
  });

  it('does not copy symlinks out of the output directory', async () => {
    const out = await mkdtemp(join(tmpdir(), 'capsule-cli-out-'));
    const secret = join(testDataDir(), 'host-secret.txt');
    await writeFile(secret, 'host secret');
    await chmod(secret, 0o644);
    try {
      const r = await run('--output', out, '--json', '--', 'sh', '-c', `ln -s ${secret} /workspace/output/link; echo ok > /workspace/output/real`);
      const result = JSON.parse(r.stdout) as { output: { files: { path: string }[]; skipped: { path: string; reason: string }[] } };
      expect(result.output.files.map((f) => f.path)).toEqual(['real']);
      expect(result.output.skipped).toEqual([{ path: 'link', reason: 'symlink' }]);
    } finally {
      await rm(out, { recursive: true, force: true });
      await rm(secret);
    }
  });
});
