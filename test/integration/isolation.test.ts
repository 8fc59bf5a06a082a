import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { homedir, tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { afterEach, describe, expect, it } from 'vitest';
import { describeResult, expectNoLeaks, python, testRunner } from '../helpers/sandbox.js';
import { sandboxUidProcesses } from '../helpers/leaks.js';

const runner = testRunner();
afterEach(expectNoLeaks);

describe('namespace sandbox isolation (real bwrap, seccomp, cgroups)', () => {
  it('runs as a non-root uid inside, mapped to an unprivileged host uid', async () => {
    let hostView: { pid: number; uid: number; name: string }[] | undefined;
    const r = await runner.run(
      ['sh', '-c', 'id -u; grep -E "^(CapEff|NoNewPrivs|Seccomp):" /proc/self/status; echo ready; sleep 30'],
      {
        onStdout: (chunk) => {
          // While the sandbox waits, look at it from the host: its processes run as a sandbox uid.
          if (chunk.toString().includes('ready')) void sandboxUidProcesses().then((found) => (hostView = found));
        },
        spec: { limits: { wallClockMs: 1500 } },
      },
    );
    expect(r.limit?.resource, describeResult(r)).toBe('wall_clock');
    const [uid, ...status] = r.stdout.trim().split('\n');
    expect(uid).toBe('1000');
    expect(status).toEqual(['CapEff:\t0000000000000000', 'NoNewPrivs:\t1', 'Seccomp:\t2', 'ready']);
    // The agent, sh and sleep (and bwrap) run as a sandbox uid on the host, never as root.
    expect(hostView?.map((p) => p.name), 'sandbox processes seen from the host').toEqual(expect.arrayContaining(['bwrap', 'capsule-agent', 'sh', 'sleep']));
  });

  it('cannot see host files outside its binds', async () => {
    const marker = join(homedir(), `capsule-marker-${randomBytes(6).toString('hex')}`);
    await writeFile(marker, 'host secret');
    try {
      const r = await runner.run(['sh', '-c', `cat ${marker}; ls /root; ls ${process.cwd()}; ls /; echo done`]);
      expect(r.stdout, describeResult(r)).not.toContain('host secret');
      expect(r.stderr).toContain('No such file or directory');
      const top = r.stdout.split('\n');
      expect(top).not.toContain('root');
      expect(top).not.toContain('work');
      expect(top).toContain('workspace');
      expect(r.stdout).toContain('done');
    } finally {
      await rm(marker);
    }
  });

  it("does not inherit the host's environment", async () => {
    process.env.CAPSULE_TEST_HOST_SECRET = 'do-not-leak';
    try {
      const r = await runner.run(['env'], { spec: { env: { GIVEN: 'yes' } } });
      expect(r.outcome, describeResult(r)).toBe('ok');
      expect(r.stdout).not.toContain('do-not-leak');
      expect(r.stdout).toContain('GIVEN=yes');
      const names = r.stdout.trim().split('\n').map((line) => line.split('=')[0]).sort();
      expect(names).toEqual(['GIVEN', 'HOME', 'LANG', 'LOGNAME', 'PATH', 'SHELL', 'USER']);
    } finally {
      delete process.env.CAPSULE_TEST_HOST_SECRET;
    }
  });

  it('cannot see host processes', async () => {
    const r = await runner.run(['sh', '-c', 'ls /proc | grep -E "^[0-9]+$" | wc -l; cat /proc/1/cmdline | tr "\\0" " "']);
    expect(r.outcome, describeResult(r)).toBe('ok');
    const [count] = r.stdout.trim().split('\n');
    // bwrap's init, the agent, sh, ls, grep, wc: a handful, never the host's hundreds.
    expect(Number(count)).toBeLessThan(10);
    expect(r.stdout).not.toContain(String(process.pid));
  });

  it('shows /input read-only', async () => {
    const input = await mkdtemp(join(tmpdir(), 'capsule-input-'));
    await chmod(input, 0o755);
    try {
      await writeFile(join(input, 'data.csv'), 'a,b\n1,2\n');
      const r = await runner.run(['sh', '-c', 'cat /input/data.csv; touch /input/new 2>&1; echo x >> /input/data.csv 2>&1; true'], { inputDir: input });
      expect(r.stdout, describeResult(r)).toContain('a,b\n1,2\n');
      expect(r.stdout).toContain('Read-only file system');
    } finally {
      await rm(input, { recursive: true });
    }
  });

  it('can write only /workspace and /tmp', async () => {
    const r = await runner.run([
      'sh', '-c',
      'for p in /workspace/ok /tmp/ok /usr/x /etc/x /x /home/x /var/x; do if touch $p 2>/dev/null; then echo "writable $p"; else echo "denied $p"; fi; done',
    ]);
    expect(r.stdout.trim().split('\n'), describeResult(r)).toEqual([
      'writable /workspace/ok', 'writable /tmp/ok', 'denied /usr/x', 'denied /etc/x', 'denied /x', 'denied /home/x', 'denied /var/x',
    ]);
  });

  it('denies ptrace, mount, unshare, keyctl, bpf, perf_event_open and io_uring', async () => {
    const code = `
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
calls = {"ptrace": (101, 0, 0, 0, 0), "mount": (165, b"none", b"/tmp", b"tmpfs", 0, 0),
         "unshare": (272, 0x10000000), "keyctl": (250, 0, 0, 0, 0, 0), "bpf": (321, 0, 0, 0),
         "perf_event_open": (298, 0, 0, -1, -1, 0), "io_uring_setup": (425, 1, 0), "setns": (308, 0, 0)}
for name, args in calls.items():
    rc = libc.syscall(*[ctypes.c_char_p(a) if isinstance(a, bytes) else ctypes.c_long(a) for a in args])
    print(name, "denied" if rc == -1 and ctypes.get_errno() == 1 else f"allowed rc={rc} errno={ctypes.get_errno()}")
`;
    const r = await python(runner, code);
    expect(r.outcome, describeResult(r)).toBe('ok');
    const lines = r.stdout.trim().split('\n');
    expect(lines).toEqual(['ptrace', 'mount', 'unshare', 'keyctl', 'bpf', 'perf_event_open', 'io_uring_setup', 'setns'].map((n) => `${n} denied`));
  });

  it('cannot make a user namespace or a btrfs subvolume that would escape the disk quota', async () => {
    const r = await runner.run(['sh', '-c', 'unshare -U true 2>&1; echo "unshare=$?"; btrfs subvolume create /workspace/sub 2>&1; echo "subvol=$?"']);
    expect(r.stdout, describeResult(r)).toMatch(/unshare=1/);
    expect(r.stdout).toMatch(/subvol=1/);
  });

  it('has no network but loopback', async () => {
    const r = await runner.run(['sh', '-c', 'cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d " "']);
    expect(r.outcome, describeResult(r)).toBe('ok');
    expect(r.stdout.trim().split('\n')).toEqual(['lo']);
  });
});
