import { execFileSync } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { release } from 'node:os';
import { describe, expect, it } from 'vitest';
import { CGROUP2_MOUNT, favorCgroupMigrations, missingOptions, parseMountinfo, remountOptions } from '../../src/host/cgroup-migrations.host.js';
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
    // The mount's other options are kept: still read-write.
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

  it('names every option a mount has when it remounts, so that none is lost (systemd mounts cgroup2 with nsdelegate)', () => {
    const line = `35 24 0:30 / ${CGROUP2_MOUNT} rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot`;
    const options = parseMountinfo(`${line}\n`, CGROUP2_MOUNT);
    expect(options).toEqual({ mount: ['rw', 'nosuid', 'nodev', 'noexec', 'relatime'], super: ['rw', 'nsdelegate', 'memory_recursiveprot'] });
    expect(remountOptions(options!)).toEqual(['rw', 'nosuid', 'nodev', 'noexec', 'relatime', 'nsdelegate', 'memory_recursiveprot']);
    // A remount that dropped one is told apart (and undone by favorCgroupMigrations).
    expect(missingOptions(options!, { mount: options!.mount, super: ['rw', 'favordynmods'] })).toEqual(['nsdelegate', 'memory_recursiveprot']);
    expect(parseMountinfo(line.replace('cgroup2 cgroup2', 'cgroup cgroup'), CGROUP2_MOUNT)).toBeUndefined();
  });

  it.runIf(kernelHasOption)('turns the option on when the mount lacks it, and keeps every other option', async () => {
    const mountinfo = async () => parseMountinfo(await readFile('/proc/self/mountinfo', 'utf8'), CGROUP2_MOUNT)!;
    const start = await mountinfo();
    // Off first (the host's own options, favordynmods left out), as on a fresh boot.
    const without = remountOptions(start).filter((option) => option !== 'favordynmods');
    execFileSync('mount', ['--options-source=disable', '-o', ['remount', ...without].join(','), CGROUP2_MOUNT]);
    const off = await mountinfo();
    expect(off.super).not.toContain('favordynmods');
    expect(await favorCgroupMigrations()).toEqual({ mode: 'favordynmods', changed: true });
    const on = await mountinfo();
    expect(on.super).toContain('favordynmods');
    expect(missingOptions(off, on)).toEqual([]);
  });
});
