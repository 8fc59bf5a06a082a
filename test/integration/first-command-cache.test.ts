import { execFileSync } from 'node:child_process';
import { copyFile, mkdir, open, rm, symlink, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
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
    // A Debian-shaped root from the host's own files, links as Debian has them (the loader's
    // is absolute: it must resolve inside the root, not on the host).
    const root = join(dir, 'debian');
    const shell = await open('/bin/sh');
    const interpreter = await elfInterpreter(shell, (await shell.stat()).size).finally(() => shell.close());
    expect(interpreter).toBe('/lib64/ld-linux-x86-64.so.2');
    const libDir = 'usr/lib/x86_64-linux-gnu';
    for (const sub of ['etc', 'usr/bin', libDir, 'usr/lib64']) await mkdir(join(root, sub), { recursive: true });
    const copies: [string, string][] = [
      ['/etc/passwd', 'etc/passwd'], ['/etc/group', 'etc/group'], ['/etc/ld.so.cache', 'etc/ld.so.cache'],
      ['/usr/bin/dash', 'usr/bin/dash'], ['/usr/bin/true', 'usr/bin/true'],
      [`/${libDir}/ld-linux-x86-64.so.2`, `${libDir}/ld-linux-x86-64.so.2`], [`/${libDir}/libc.so.6`, `${libDir}/libc.so.6`],
    ];
    for (const [from, to] of copies) await copyFile(from, join(root, to));
    await symlink('usr/bin', join(root, 'bin'));
    await symlink('usr/lib64', join(root, 'lib64'));
    await symlink('dash', join(root, 'usr/bin/sh'));
    await symlink(`/${libDir}/ld-linux-x86-64.so.2`, join(root, 'usr/lib64/ld-linux-x86-64.so.2'));
    const files = copies.map(([, to]) => join(root, to));
    drop(files);
    expect(resident(files)).toEqual(files.map(() => 0));

    await warmFirstCommand(root);
    const after = resident(files);
    const warmed = ['etc/passwd', 'etc/group', 'etc/ld.so.cache', 'usr/bin/dash', `${libDir}/ld-linux-x86-64.so.2`, `${libDir}/libc.so.6`];
    copies.forEach(([, to], index) => {
      if (warmed.includes(to)) expect(after[index], to).toBeGreaterThan(0);
      // A command itself is not guessed at.
      else expect(after[index], to).toBe(0);
    });
  });

  it("follows no link out of the root, opens nothing but regular files, and warms what a root without a shell has", async () => {
    const root = join(dir, 'hostile');
    const outside = join(dir, 'outside.txt');
    await mkdir(join(root, 'etc'), { recursive: true });
    await writeFile(outside, 'x'.repeat(64 * 1024));
    // Climbing out stops at the root; an absolute link means the root's own path.
    await symlink('../../outside.txt', join(root, 'etc/group'));
    await symlink(outside, join(root, 'etc/ld.so.cache'));
    // A FIFO would block an open without O_NONBLOCK, and is no file to read.
    execFileSync('mkfifo', [join(root, 'etc/passwd')]);
    drop([outside]);

    await warmFirstCommand(root);
    expect(resident([outside])).toEqual([0]);
  });
});
