import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { afterEach, describe, expect, it } from 'vitest';
import { GvisorBackend } from '../../src/backends/gvisor/gvisor-backend.host.js';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { parseSpec } from '../../src/sandbox-spec/index.js';
import { describeResult, expectNoLeaks, testDataDir, testRunner } from '../helpers/sandbox.js';
import { descendants, runscContainers } from '../helpers/leaks.js';

afterEach(expectNoLeaks);

function newBackend(): GvisorBackend {
  return new GvisorBackend({ host: new HostEnvironment({ dataDir: testDataDir() }) });
}

describe('gvisor backend', () => {
  it('reports what it enforces, and no network but none without a network seam', async () => {
    const probe = await newBackend().probe();
    expect(probe.available, probe.reason).toBe(true);
    expect(probe.capabilities).toEqual(expect.arrayContaining(['limits.memory', 'limits.pids', 'network.none', 'pause.keepMemoryOnDisk']));
    expect(probe.capabilities).not.toContain('network.allowlist');
  });

  it('fails closed on a spec it cannot enforce', async () => {
    const spec = parseSpec({ backend: 'gvisor', network: { mode: 'allowlist', allow: ['example.com:443'] } });
    await expect(newBackend().create(spec, { id: 'gv-refuse' })).rejects.toMatchObject({ code: 'BACKEND_CANNOT_ENFORCE' });
    await expect(testRunner().run(['true'], { spec: { backend: 'gvisor', network: { mode: 'internet' } } })).rejects.toMatchObject({
      code: 'BACKEND_CANNOT_ENFORCE',
    });
  });

  it('runs the agent as the container init and shows the spec memory limit as MemTotal', async () => {
    const r = await testRunner().run(['sh', '-c', 'tr "\\0" " " </proc/1/cmdline; echo; head -1 /proc/meminfo'], {
      spec: { backend: 'gvisor', limits: { memoryBytes: 96 * 1024 ** 2 } },
    });
    expect(r.outcome, describeResult(r)).toBe('ok');
    expect(r.stdout).toMatch(/^\/\.capsule\/capsule-agent\s*\nMemTotal:\s+98304 kB\n$/);
  });

  it('has the workspace quota in force when create() returns, though it is set while runsc boots', async () => {
    const sandbox = await newBackend().create(parseSpec({ backend: 'gvisor', limits: { diskBytes: 24 * 1024 ** 2 } }), { id: 'gv-quota' });
    try {
      const { stdout } = await promisify(execFile)('btrfs', ['qgroup', 'show', '-r', '--raw', '-f', sandbox.workspaceDir]);
      expect(stdout).toMatch(/^0\/\d+\s+\d+\s+\d+\s+25165824\s/m);
    } finally {
      await sandbox.destroy();
    }
  });

  it('undoes every step of a create aborted after its bundle was written', async () => {
    const backend = newBackend();
    await expect(backend.create(parseSpec({ backend: 'gvisor' }), { id: 'gv-abort', signal: AbortSignal.abort() })).rejects.toMatchObject({
      code: 'ABORTED',
    });
    // afterEach(expectNoLeaks) checks the cgroups and the workspace; the bundle goes too.
    expect(await backend.reconcile(new Set())).toEqual({ removed: [], failures: [] });
  });

  it('reconcile removes the runsc container, cgroups and files a crashed process left', async () => {
    const backend = newBackend();
    const sandbox = await backend.create(parseSpec({ backend: 'gvisor' }), { id: 'gv-orphan' });
    expect(await runscContainers(testDataDir())).toEqual(['container gv-orphan']);
    // A crash: the launcher and runsc go; nothing cleans up after them.
    const launcher = (await descendants(process.pid)).find((line) => line.endsWith(' capsule-launch'));
    process.kill(Number(launcher?.split(' ')[0]), 'SIGKILL');
    await sandbox.lost;
    const report = await newBackend().reconcile(new Set());
    expect(report.failures).toEqual([]);
    expect(report.removed).toEqual(expect.arrayContaining(['runsc:gv-orphan', 'cgroup:gv-orphan', 'bundle:gv-orphan', 'workspace:gv-orphan']));
    await sandbox.destroy(); // the old object finds nothing left to remove, and does not fail
  });
});
