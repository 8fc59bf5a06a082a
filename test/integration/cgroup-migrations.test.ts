import { readFile } from 'node:fs/promises';
import { release } from 'node:os';
import { describe, expect, it } from 'vitest';
import { CGROUP2_MOUNT, favorCgroupMigrations } from '../../src/host/cgroup-migrations.host.js';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { testDataDir } from '../helpers/sandbox.js';

/*
 * A sandbox start moves its launcher into v1 cgroups; by default each move waits for an RCU
 * grace period. Preparing the host turns on the cgroup2 option that spares it (favordynmods,
 * Linux 6.0+), and says what it found. Checked on the real mount, not a copy of mountinfo.
 */
const [major = 0] = release().split('.').map(Number);
const kernelHasOption = major >= 6;

async function cgroup2Options(): Promise<string[]> {
  for (const line of (await readFile('/proc/self/mountinfo', 'utf8')).split('\n')) {
    const [mount, fs] = line.split(' - ');
    if (mount?.split(' ')[4] === CGROUP2_MOUNT && fs?.startsWith('cgroup2 ')) return fs.split(' ')[2]?.split(',') ?? [];
  }
  throw new Error(`no cgroup2 mount at ${CGROUP2_MOUNT}`);
}

describe('cgroup migrations', () => {
  it('a prepared host has favordynmods on its cgroup2 mount, and says so', async () => {
    const host = new HostEnvironment({ dataDir: testDataDir() });
    expect(host.cgroupMigrations()).toBeUndefined();
    await host.ensure();
    const found = host.cgroupMigrations();
    if (!kernelHasOption) {
      // An older kernel refuses the option: the host runs as it was, and the reason is given.
      expect(found).toMatchObject({ mode: 'default', reason: expect.stringContaining('favordynmods') as unknown });
      return;
    }
    expect(found?.mode).toBe('favordynmods');
    expect(await cgroup2Options()).toContain('favordynmods');
    // The mount's other options are kept (util-linux passes them along): still read-write.
    expect(await cgroup2Options()).toContain('rw');
  });

  it('asked again, it changes nothing', async () => {
    await favorCgroupMigrations();
    expect(await favorCgroupMigrations()).toEqual(kernelHasOption ? { mode: 'favordynmods', changed: false } : expect.objectContaining({ mode: 'default' }));
  });

  it('an operator who declines it gets the host as it is, with the reason', async () => {
    const host = new HostEnvironment({ dataDir: testDataDir(), favorCgroupMigrations: false });
    await host.ensure();
    expect(host.cgroupMigrations()).toEqual({ mode: 'default', reason: expect.stringContaining('favorCgroupMigrations: false') as unknown });
  });

  it('no cgroup2 mount at the path: reported, nothing run', async () => {
    expect(await favorCgroupMigrations('/nonexistent/cgroup2')).toEqual({ mode: 'default', reason: 'no cgroup2 mount at /nonexistent/cgroup2' });
  });
});
