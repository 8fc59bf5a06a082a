import { execFileSync, spawnSync } from 'node:child_process';
import { lstat, mkdir, mkdtemp, readFile, rm, rmdir, stat, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
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

/*
 * The launcher is the final word on a tenant's host mount (issue 11, finding 1): whatever the
 * engine checked, what it opens as root is resolved again beneath the root, as O_PATH, and refused
 * unless it is a directory or regular file away from kernel filesystems and the data dir. Each
 * case runs the launcher directly, as a backend does, with a timeout: a FIFO opened for reading
 * would block it.
 */
describe('capsule-launch --mount', () => {
  let launcher: string;
  let root: string;

  const launch = (mountRoot: string, subpath: string, kind: 'd' | 'f' = 'd', then: string[] = ['/bin/true']) =>
    spawnSync(launcher, ['--forbid', testDataDir(), '--mount', `0:10:${kind}`, mountRoot, subpath, '--', ...then], { encoding: 'utf8', timeout: 10_000 });

  beforeAll(async () => {
    launcher = (await new HostEnvironment({ dataDir: testDataDir() }).ensure()).launcher;
    root = await mkdtemp(join(tmpdir(), 'capsule-launch-root-'));
    await mkdir(join(root, 'dir'));
    await writeFile(join(root, 'dir', 'file.txt'), 'hello\n');
  });
  afterAll(() => rm(root, { recursive: true, force: true }));

  it('resolves a directory or regular file beneath the root and hands it on as fd 10', () => {
    const dir = launch(root, 'dir', 'd', ['/bin/ls', '/proc/self/fd/10/']);
    expect(dir.status, dir.stderr).toBe(0);
    expect(dir.stdout).toBe('file.txt\n');
    const file = launch(root, 'dir/file.txt', 'f', ['/bin/cat', '/proc/self/fd/10']);
    expect(file.status, file.stderr).toBe(0);
    expect(file.stdout).toBe('hello\n');
  });

  it('refuses what the engine would have refused, and what was swapped in after its check', async () => {
    const dataDir = testDataDir();
    await symlink(dataDir, join(root, 'to-data'));
    await symlink('dir', join(root, 'inner-link'));
    execFileSync('mkfifo', [join(root, 'fifo')]);
    execFileSync('mknod', [join(root, 'device'), 'c', '1', '3']);
    // The engine saw a directory here; by launch time it is a symlink to the data dir.
    await mkdir(join(root, 'swapped'));
    await rmdir(join(root, 'swapped'));
    await symlink(dataDir, join(root, 'swapped'));
    const cases: [string, string, string, RegExp][] = [
      [root, 'to-data', 'INVALID_PATH', /symlink/],
      [root, 'to-data/volume', 'INVALID_PATH', /symlink/],
      [root, 'inner-link', 'INVALID_PATH', /symlink/],
      [root, 'swapped', 'INVALID_PATH', /symlink/],
      [root, '..', 'INVALID_PATH', /out of the root/],
      [root, 'dir/../..', 'INVALID_PATH', /out of the root/],
      [root, '/etc', 'INVALID_PATH', /relative/],
      [root, 'fifo', 'INVALID_PATH', /device, FIFO or socket/],
      [root, 'device', 'INVALID_PATH', /device, FIFO or socket/],
      [root, 'dir/file.txt', 'INVALID_PATH', /changed type/],
      [dataDir, '.', 'PERMISSION_DENIED', /data directory/],
      [dataDir, 'volume', 'PERMISSION_DENIED', /data directory/],
      [join(dataDir, '..'), '.', 'PERMISSION_DENIED', /data directory|root is no longer/],
      ['/', '.', 'PERMISSION_DENIED', /data directory/],
      ['/proc', '.', 'PERMISSION_DENIED', /kernel filesystem/],
      ['/proc', '1', 'PERMISSION_DENIED', /kernel filesystem/],
      ['/sys', '.', 'PERMISSION_DENIED', /kernel filesystem/],
      ['/sys/fs', 'cgroup', 'PERMISSION_DENIED', /kernel filesystem/],
      ['/dev', 'pts', 'PERMISSION_DENIED', /kernel filesystem/],
      [join(root, 'to-data'), '.', 'PERMISSION_DENIED', /root is no longer/],
    ];
    for (const [mountRoot, subpath, code, why] of cases) {
      const r = launch(mountRoot, subpath);
      expect(r.error, `${mountRoot} ${subpath}`).toBeUndefined(); // no timeout: nothing blocked
      expect(r.status, `${mountRoot} ${subpath}: ${r.stderr}`).toBe(125);
      expect(r.stderr, `${mountRoot} ${subpath}`).toMatch(new RegExp(`mount 0 refused \\(${code}\\): `));
      expect(r.stderr, `${mountRoot} ${subpath}`).toMatch(why);
    }
  });
});

/*
 * A namespace sandbox's fresh workspace is made by the launcher (--subvolume), not by `btrfs`
 * spawns: the same subvolume, owner, mode and quota limit, or a clear refusal before anything runs.
 */
describe('capsule-launch --subvolume', () => {
  const id = 'launchsubvol';
  let host: HostEnvironment;
  let launcher: string;

  beforeAll(async () => {
    host = new HostEnvironment({ dataDir: testDataDir() });
    launcher = (await host.ensure()).launcher;
  });
  afterEach(() => host.volume.delete(id));

  const launch = (spec: string) => spawnSync(launcher, ['--subvolume', spec, '--', '/bin/true'], { encoding: 'utf8', timeout: 10_000 });

  it('makes the workspace subvolume with its owner, mode 0700 and disk limit', async () => {
    const path = host.volume.path(id);
    const made = launch(`4242:${8 * 1024 * 1024}:${path}`);
    expect(made.status, made.stderr).toBe(0);
    const info = await stat(path);
    expect({ uid: info.uid, gid: info.gid, mode: info.mode & 0o7777 }).toEqual({ uid: 4242, gid: 4242, mode: 0o700 });
    expect(execFileSync('btrfs', ['inspect-internal', 'rootid', path], { encoding: 'utf8' }).trim()).not.toBe('5');
    // The limit as btrfs reports it for this subvolume's quota group: max referenced, 8 MiB.
    const show = execFileSync('btrfs', ['qgroup', 'show', '-r', '--raw', '-f', path], { encoding: 'utf8' });
    expect(show.trim().split('\n').at(-1)?.split(/\s+/)[3]).toBe(String(8 * 1024 * 1024));
  });

  it('with --subvolume-from, makes a writable snapshot whose files, links included, become the uid\'s', async () => {
    const source = host.volume.path(`${id}src`);
    execFileSync('btrfs', ['subvolume', 'create', source]);
    try {
      await mkdir(join(source, 'dir'));
      await writeFile(join(source, 'dir', 'file.txt'), 'kept\n');
      await symlink('dir/file.txt', join(source, 'link'));
      execFileSync('chown', ['-R', '--no-dereference', '5151:5151', source]);
      const path = host.volume.path(id);
      const made = spawnSync(launcher, ['--subvolume', `4242:0:${path}`, '--subvolume-from', source, '--', '/bin/true'], { encoding: 'utf8', timeout: 10_000 });
      expect(made.status, made.stderr).toBe(0);
      for (const entry of ['', 'dir', 'dir/file.txt', 'link']) {
        const info = await lstat(join(path, entry));
        expect({ entry, uid: info.uid, gid: info.gid }).toEqual({ entry, uid: 4242, gid: 4242 });
      }
      expect((await stat(path)).mode & 0o7777).toBe(0o700);
      expect(await readFile(join(path, 'link'), 'utf8')).toBe('kept\n');
      // The source is untouched.
      expect((await lstat(join(source, 'dir', 'file.txt'))).uid).toBe(5151);
    } finally {
      await host.volume.delete(`${id}src`);
    }
  });

  it('refuses a path that exists, one off btrfs and a malformed spec, saying which', () => {
    const path = host.volume.path(id);
    expect(launch(`4242:0:${path}`).status).toBe(0);
    const again = launch(`4242:0:${path}`);
    expect(again.status).toBe(125);
    expect(again.stderr).toContain(`capsule-launch: subvolume ${path}: create: File exists`);
    const offBtrfs = launch(`4242:0:${join(tmpdir(), `capsule-not-btrfs-${process.pid}`)}`);
    expect(offBtrfs.status).toBe(125);
    expect(offBtrfs.stderr).toMatch(/subvolume .*: create: Inappropriate ioctl for device/);
    const malformed = launch(`someone:0:${path}`);
    expect(malformed.status).toBe(125);
    expect(malformed.stderr).toContain('--subvolume wants UID:LIMIT_BYTES:PATH (bad uid)');
  });

  it("--root-limit sets an existing root's exclusive limit, as `btrfs qgroup limit -e` does, before the program runs", async () => {
    // A template root shares its layer's extents: only what the sandbox writes is exclusive.
    const path = host.volume.rootPath(id);
    execFileSync('btrfs', ['subvolume', 'create', path]);
    const limited = spawnSync(launcher, ['--root-limit', `${6 * 1024 * 1024}:${path}`, '--', '/bin/sh', '-c', `btrfs qgroup show -e --raw -f ${path}`], { encoding: 'utf8', timeout: 10_000 });
    expect(limited.status, limited.stderr).toBe(0);
    // qgroupid rfer excl max_excl: set when the program ran.
    expect(limited.stdout.trim().split('\n').at(-1)?.split(/\s+/)[3]).toBe(String(6 * 1024 * 1024));
    const relative = spawnSync(launcher, ['--root-limit', '1024:some/root', '--', '/bin/true'], { encoding: 'utf8', timeout: 10_000 });
    expect(relative.status).toBe(125);
    expect(relative.stderr).toContain('--root-limit wants LIMIT_BYTES:PATH (an absolute path)');
    const missing = spawnSync(launcher, ['--root-limit', `1024:${path}-missing`, '--', '/bin/true'], { encoding: 'utf8', timeout: 10_000 });
    expect(missing.status).toBe(125);
    expect(missing.stderr).toContain(`capsule-launch: subvolume ${path}-missing: open: No such file or directory`);
    // A directory inside a subvolume: its limit would be the enclosing subvolume's (qgroupid 0).
    await mkdir(join(path, 'inner'));
    const inner = spawnSync(launcher, ['--root-limit', `1024:${path}/inner`, '--', '/bin/true'], { encoding: 'utf8', timeout: 10_000 });
    expect(inner.status).toBe(125);
    expect(inner.stderr).toContain(`capsule-launch: subvolume ${path}/inner: is not a subvolume`);
  });
});
