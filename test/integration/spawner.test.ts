import { mkdtemp, readdir, readFile, readlink, rm, stat as stat_ } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { Spawner } from '../../src/host/spawner.host.js';
import { testDataDir } from '../helpers/sandbox.js';

/*
 * capsule-spawn starts each supervisor in place of the server (decision 026). These run the real
 * helper on real processes: what a child gets (its stdio, environment, fds, session), how a
 * start is reported (ready, ended without, could not exec), and what happens when the helper
 * itself is killed.
 */
describe('capsule-spawn', () => {
  let helper: string;
  let dir: string;
  let spawner: Spawner;

  beforeAll(async () => {
    const { launcher } = await new HostEnvironment({ dataDir: testDataDir() }).ensure();
    helper = join(launcher, '..', 'capsule-spawn');
    dir = await mkdtemp(join(tmpdir(), 'capsule-spawn-test-'));
    spawner = new Spawner(helper);
  });

  afterAll(async () => {
    spawner.close();
    await rm(dir, { recursive: true, force: true });
  });

  it('starts a child in a session of its own with /dev/null, a pipe and the log as stdio, no other fd and no environment', async () => {
    const log = join(dir, 'first.log');
    const child = await spawner.spawn('/bin/sh', ['-c', 'echo ready; echo said >&2; exec sleep 60'], log);
    await child.ready;
    try {
      // What sleep has once the shell is replaced (the shell may hold one of its own until then).
      const deadline = Date.now() + 10_000;
      while ((await readFile(`/proc/${child.pid}/comm`, 'utf8')).trim() !== 'sleep' && Date.now() < deadline) await new Promise((r) => setTimeout(r, 5));
      const fds = await readdir(`/proc/${child.pid}/fd`);
      expect(fds.sort()).toEqual(['0', '1', '2']);
      expect(await readlink(`/proc/${child.pid}/fd/0`)).toBe('/dev/null');
      expect(await readlink(`/proc/${child.pid}/fd/1`)).toMatch(/^pipe:/);
      expect(await readlink(`/proc/${child.pid}/fd/2`)).toBe(log);
      // Nothing from this process's environment; sh exports PWD for itself.
      const environment = (await readFile(`/proc/${child.pid}/environ`, 'utf8')).split('\0').filter(Boolean);
      expect(environment.filter((entry) => !entry.startsWith('PWD='))).toEqual([]);
      const stat = (await readFile(`/proc/${child.pid}/stat`, 'utf8')).split(') ')[1]!.split(' ');
      expect(stat[3]).toBe(String(child.pid)); // its session is its own
      expect(await readFile(log, 'utf8')).toBe('said\n');
      expect((await stat_(log)).mode & 0o777).toBe(0o600);
    } finally {
      child.kill('SIGKILL');
    }
    expect(await child.exited()).toBe(137);
  });

  it('rejects ready for a child that ends without saying it, and reports its status', async () => {
    const child = await spawner.spawn('/bin/sh', ['-c', 'echo not-ready; exit 3'], join(dir, 'second.log'));
    await expect(child.ready).rejects.toMatchObject({ code: 'SANDBOX_CRASHED' });
    expect(await child.exited()).toBe(3);
  });

  it('reports a signal as 128 + N', async () => {
    const child = await spawner.spawn('/bin/sh', ['-c', 'echo ready; exec sleep 60'], join(dir, 'third.log'));
    await child.ready;
    child.kill('SIGKILL');
    expect(await child.exited()).toBe(137);
  });

  it('writes an exec failure to the log and ends the child with 127', async () => {
    const log = join(dir, 'fourth.log');
    const child = await spawner.spawn(join(dir, 'no-such-program'), [], log);
    await expect(child.ready).rejects.toMatchObject({ code: 'SANDBOX_CRASHED' });
    expect(await child.exited()).toBe(127);
    expect(await readFile(log, 'utf8')).toContain('capsule-spawn: exec');
  });

  it('starts many at once, each answered on its own', async () => {
    const children = await Promise.all(
      Array.from({ length: 20 }, (_, i) => spawner.spawn('/bin/sh', ['-c', i % 2 === 0 ? `echo ready; exit ${i}` : `exit ${i}`], join(dir, `many-${i}.log`))),
    );
    const ready = await Promise.allSettled(children.map((child) => child.ready));
    expect(ready.map((r) => r.status)).toEqual(children.map((_, i) => (i % 2 === 0 ? 'fulfilled' : 'rejected')));
    expect(await Promise.all(children.map((child) => child.exited()))).toEqual(children.map((_, i) => i));
  });

  it('when the helper is killed, waits end (exits unknown, starts refused) and the next spawn starts a new helper', async () => {
    const own = new Spawner(helper);
    const running = await own.spawn('/bin/sh', ['-c', 'echo ready; exec sleep 60'], join(dir, 'orphan.log'));
    await running.ready;
    const helperPid = Number((await readFile(`/proc/${running.pid}/stat`, 'utf8')).split(') ')[1]!.split(' ')[1]);
    expect((await readFile(`/proc/${helperPid}/comm`, 'utf8')).trim()).toBe('capsule-spawn');
    const exit = running.exited();
    process.kill(helperPid, 'SIGKILL');
    expect(await exit).toBeUndefined();
    // The child lives on (reparented), as a supervisor must when its starter is gone.
    expect((await readFile(`/proc/${running.pid}/comm`, 'utf8')).trim()).toBe('sleep');
    process.kill(running.pid, 'SIGKILL');
    const again = await own.spawn('/bin/sh', ['-c', 'echo ready'], join(dir, 'again.log'));
    await again.ready;
    expect(await again.exited()).toBe(0);
    own.close();
  });

  it('refuses an argument with a NUL byte', async () => {
    await expect(spawner.spawn('/bin/echo', ['a\0b'], join(dir, 'nul.log'))).rejects.toMatchObject({ code: 'INTERNAL' });
  });

  it('says clearly when the helper is missing', async () => {
    const missing = new Spawner(join(dir, 'no-capsule-spawn'));
    await expect(missing.spawn('/bin/true', [], join(dir, 'missing.log'))).rejects.toMatchObject({ code: 'HOST_NOT_READY' });
  });
});
