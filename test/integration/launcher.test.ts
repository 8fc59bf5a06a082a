import { spawnSync } from 'node:child_process';
import { mkdir, rmdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';

/*
 * capsule-launch forks its child straight into the sandbox's cgroup v2 group (clone3 with
 * CLONE_INTO_CGROUP). This kernel kills a child cloned into a group whose cgroup.kill was used
 * before; the launcher must notice and join by a write instead (a gVisor sandbox resumed in its
 * old group depends on it).
 */
afterEach(expectNoLeaks);

describe('capsule-launch', () => {
  it('starts its child in the v2 group, also in a group that was killed before', async () => {
    const host = new HostEnvironment({ dataDir: testDataDir() });
    const { launcher } = await host.ensure();
    const name = `${host.cgroupPrefix}launchtest`;
    const dir = join('/sys/fs/cgroup/unified', name);
    await mkdir(dir);
    try {
      const run = () => spawnSync(launcher, ['--cgroup2-dir', dir, '--', '/bin/cat', '/proc/self/cgroup'], { encoding: 'utf8', timeout: 10_000 });
      const fresh = run();
      expect(fresh.status, fresh.stderr).toBe(0);
      expect(fresh.stdout).toContain(`0::/${name}\n`);
      await writeFile(join(dir, 'cgroup.kill'), '1');
      const again = run();
      expect(again.status, again.stderr).toBe(0);
      expect(again.stdout).toContain(`0::/${name}\n`);
    } finally {
      await rmdir(dir);
    }
  });
});
