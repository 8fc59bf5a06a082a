import { execFileSync } from 'node:child_process';
import { copyFile, mkdir, open, realpath, rm, symlink, truncate, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { elfInterpreter, warmFirstCommand } from '../../src/templates/rootfs/first-command-cache.host.js';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';

/*
 * A spare root's page cache is warmed before a create takes it: the files nearly every first
 * command reads. Real files on the test volume (btrfs, whose pages can be dropped and counted;
 * tmpfs pages could not), measured with util-linux's fincore.
 */
describe('warmFirstCommand', () => {
  let dir: string;

  /** Resident bytes of each file, by fincore. */
  const resident = (files: string[]): number[] =>
    execFileSync('fincore', ['--bytes', '--noheadings', '--output', 'RES', ...files], { encoding: 'utf8' })
      .trim()
      .split('\n')
      .map(Number);
  /** Writes the files back and drops their pages (POSIX_FADV_DONTNEED through dd). */
  const drop = (files: string[]): void => {
    execFileSync('sync', files);
    for (const file of files) execFileSync('dd', [`if=${file}`, 'iflag=nocache', 'count=0', 'status=none']);
  };

  beforeAll(async () => {
    const host = new HostEnvironment({ dataDir: testDataDir() });
    await host.ensure();
    dir = join(host.volume.mountPoint, `first-command-cache-${process.pid}`);
    await mkdir(dir);
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
    await expectNoLeaks();
  });

  it("reads the user database, the loader's cache, the shell, its ELF interpreter and libc, all inside the root", async () => {
    // A root made of the host's own shell, loader and libc at their real paths, reached through
    // absolute links as a distribution has them (/bin/sh, the interpreter's path): each must
    // resolve inside the root, not on the host.
    const root = join(dir, 'distro');
    const shellPath = await realpath('/bin/sh');
    const shell = await open(shellPath);
    const interpreter = await elfInterpreter(shell, (await shell.stat()).size).finally(() => shell.close());
    expect(interpreter).toMatch(/^\/.*ld.*\.so/);
    const loaderPath = await realpath(interpreter!);
    const libcPath = join(dirname(loaderPath), 'libc.so.6');
    const copied = ['/etc/passwd', '/etc/group', '/etc/ld.so.cache', shellPath, loaderPath, libcPath, await realpath('/usr/bin/true')];
    for (const file of copied) {
      await mkdir(dirname(join(root, file)), { recursive: true });
      await copyFile(file, join(root, file));
    }
    for (const [link, target] of [['/bin/sh', shellPath], [interpreter!, loaderPath]] as const) {
      if (link === target) continue;
      await mkdir(dirname(join(root, link)), { recursive: true });
      await symlink(target, join(root, link));
    }
    const files = copied.map((file) => join(root, file));
    drop(files);
    expect(resident(files)).toEqual(files.map(() => 0));

    await warmFirstCommand(root);
    const after = resident(files);
    copied.forEach((file, index) => {
      // A command itself is not guessed at.
      if (file.endsWith('/true')) expect(after[index], file).toBe(0);
      else expect(after[index], file).toBeGreaterThan(0);
    });
  });

  it('follows no link out of the root, opens nothing but regular files, and reads no file past its bound', async () => {
    const root = join(dir, 'hostile');
    const outside = join(dir, 'outside.txt');
    await mkdir(join(root, 'etc'), { recursive: true });
    await writeFile(outside, 'x'.repeat(64 * 1024));
    // Climbing out stops at the root; an absolute link means the root's own path.
    await symlink('../../outside.txt', join(root, 'etc/group'));
    await symlink(outside, join(root, 'etc/ld.so.cache'));
    // A FIFO would block an open without O_NONBLOCK, and is no file to read.
    execFileSync('mkfifo', [join(root, 'etc/passwd')]);
    // A "shell" larger than any real one is not read.
    await mkdir(join(root, 'bin'));
    const big = join(root, 'bin/sh');
    await writeFile(big, 'x');
    await truncate(big, 9 * 1024 * 1024);
    drop([outside, big]);

    await warmFirstCommand(root);
    expect(resident([outside, big])).toEqual([0, 0]);
  });
});
