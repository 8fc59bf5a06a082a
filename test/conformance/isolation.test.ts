import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { homedir, tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { afterEach, describe, expect } from 'vitest';
import { HOST_TEMPLATE } from '../../src/sandbox-spec/index.js';
import { describeResult, expectNoLeaks } from '../helpers/sandbox.js';
import { descendants, sandboxUidProcesses } from '../helpers/leaks.js';
import { backendRunner, CONFORMANCE_TARGETS, conformanceIt, needsConformanceTemplates } from './backends.js';

needsConformanceTemplates();

afterEach(expectNoLeaks);

/**
 * The bounding set of a process in a sandbox from a template: root's capabilities inside the
 * sandbox's user namespace (CHOWN 0, DAC_OVERRIDE 1, DAC_READ_SEARCH 2, FOWNER 3, FSETID 4, KILL 5,
 * SETGID 6, SETUID 7, NET_BIND_SERVICE 10, AUDIT_WRITE 29, SETFCAP 31), written out here so a
 * capability added to the code fails this case until it is reviewed.
 */
const TEMPLATE_ROOT_BOUNDING = '00000000a00004ff';

/** gVisor serves syscalls in its own user-space kernel: what the host kernel would deny may work inside it. */
const GVISOR_OWN_KERNEL =
  "gVisor serves these syscalls in its own user-space kernel (ptrace and user namespaces exist only inside it); the host's seccomp filter is runsc's own, on the sentry";

describe.each(CONFORMANCE_TARGETS)('isolation on the $backend backend, $template template', (target) => {
  const sandbox = backendRunner(target);

  conformanceIt(target, 'runs as uid 1000 with no capabilities', {}, async () => {
    const r = await sandbox.run(['sh', '-c', 'id -u; id -g; grep -E "^Cap(Eff|Prm|Bnd):" /proc/self/status']);
    expect(r.outcome, describeResult(r)).toBe('ok');
    // A template's root may own files, change users and bind low ports inside the sandbox's own
    // user namespace, so those stay in the bounding set; a process of the template's user holds
    // none of them, and no_new_privs keeps a setuid binary from raising it.
    const bounding = target.template === HOST_TEMPLATE ? '0000000000000000' : TEMPLATE_ROOT_BOUNDING;
    expect(r.stdout.trim().split('\n')).toEqual(['1000', '1000', 'CapPrm:\t0000000000000000', 'CapEff:\t0000000000000000', `CapBnd:\t${bounding}`]);
    expect(BigInt(`0x${bounding}`) & (1n << 21n), 'never CAP_SYS_ADMIN').toBe(0n);
  });

  conformanceIt(
    target,
    'sets no_new_privs and a seccomp filter on sandboxed processes',
    { gvisor: "gVisor's /proc/self/status has no NoNewPrivs or Seccomp fields (runsc sets noNewPrivileges from the OCI spec; its seccomp filter is on the sentry)" },
    async () => {
      const r = await sandbox.run(['grep', '-E', '^(NoNewPrivs|Seccomp):', '/proc/self/status']);
      expect(r.stdout.trim().split('\n'), describeResult(r)).toEqual(['NoNewPrivs:\t1', 'Seccomp:\t2']);
    },
  );

  conformanceIt(
    target,
    'runs sandboxed processes as an unprivileged host uid',
    { gvisor: 'sandboxed programs are not host processes under gVisor (the next case checks that)' },
    async () => {
      let hostView: { pid: number; uid: number; name: string }[] | undefined;
      const r = await sandbox.run(['sh', '-c', 'echo ready; sleep 30'], {
        onStdout: (chunk) => {
          if (chunk.toString().includes('ready')) void sandboxUidProcesses().then((found) => (hostView = found));
        },
        spec: { limits: { wallClockMs: 1500 } },
      });
      expect(r.limit?.resource, describeResult(r)).toBe('wall_clock');
      expect(hostView?.map((p) => p.name), 'sandbox processes seen from the host').toEqual(expect.arrayContaining(['bwrap', 'capsule-agent', 'sh', 'sleep']));
    },
  );

  conformanceIt(
    target,
    'runs sandboxed programs inside its own kernel, never as host processes',
    { namespace: 'namespace sandboxes are host processes by design, each under a host uid of its own (the case above checks that)' },
    async () => {
      let hostNames: string[] | undefined;
      const r = await sandbox.run(['sh', '-c', 'echo ready; sleep 30'], {
        onStdout: (chunk) => {
          if (chunk.toString().includes('ready')) {
            void descendants(process.pid).then((found) => (hostNames = found.map((line) => line.split(' ').slice(1).join(' '))));
          }
        },
        spec: { limits: { wallClockMs: 1500 } },
      });
      expect(r.limit?.resource, describeResult(r)).toBe('wall_clock');
      expect(hostNames, 'host processes under this test').toBeDefined();
      expect(hostNames).not.toContain('sleep');
      expect(hostNames).not.toContain('capsule-agent');
      expect(hostNames?.some((name) => name === 'runsc' || name === 'exe')).toBe(true);
    },
  );

  conformanceIt(target, 'cannot see host files outside its binds', {}, async () => {
    const marker = join(homedir(), `capsule-marker-${randomBytes(6).toString('hex')}`);
    await writeFile(marker, 'host secret');
    try {
      const r = await sandbox.run(['sh', '-c', `cat ${marker}; ls /root; ls ${process.cwd()}; ls /; echo done`]);
      expect(r.stdout, describeResult(r)).not.toContain('host secret');
      expect(r.stderr).toContain('No such file or directory');
      const top = r.stdout.split('\n');
      // A template has a /root of its own (closed to its user); the host template has none.
      if (target.template === HOST_TEMPLATE) expect(top).not.toContain('root');
      expect(top).not.toContain('work');
      expect(top).toContain('workspace');
      expect(r.stdout).toContain('done');
    } finally {
      await rm(marker);
    }
  });

  conformanceIt(target, "does not inherit the host's environment", {}, async () => {
    process.env.CAPSULE_TEST_HOST_SECRET = 'do-not-leak';
    try {
      const r = await sandbox.run(['env'], { spec: { env: { GIVEN: 'yes' } } });
      expect(r.outcome, describeResult(r)).toBe('ok');
      expect(r.stdout).not.toContain('do-not-leak');
      expect(r.stdout).toContain('GIVEN=yes');
      const names = r.stdout.trim().split('\n').map((line) => line.split('=')[0]).sort();
      // The host template names its one user's shell; a template's user comes from its /etc/passwd.
      const base = target.template === HOST_TEMPLATE ? ['HOME', 'LANG', 'LOGNAME', 'PATH', 'SHELL', 'USER'] : ['HOME', 'LANG', 'LOGNAME', 'PATH', 'USER'];
      expect(names).toEqual(['GIVEN', ...base].sort());
    } finally {
      delete process.env.CAPSULE_TEST_HOST_SECRET;
    }
  });

  conformanceIt(target, 'cannot see host processes', {}, async () => {
    const r = await sandbox.run(['sh', '-c', 'ls /proc | grep -E "^[0-9]+$" | wc -l; cat /proc/1/cmdline | tr "\\0" " "']);
    expect(r.outcome, describeResult(r)).toBe('ok');
    const [count] = r.stdout.trim().split('\n');
    // The sandbox's init, the agent, sh, ls, grep, wc: a handful, never the host's hundreds.
    expect(Number(count)).toBeLessThan(10);
    expect(r.stdout).not.toContain(String(process.pid));
  });

  conformanceIt(target, 'shows /input read-only', {}, async () => {
    const input = await mkdtemp(join(tmpdir(), 'capsule-input-'));
    // World-writable on the host: only the read-only mount can refuse the writes.
    await chmod(input, 0o777);
    try {
      await writeFile(join(input, 'data.csv'), 'a,b\n1,2\n', { mode: 0o666 });
      await chmod(join(input, 'data.csv'), 0o666);
      const r = await sandbox.run(['sh', '-c', 'cat /input/data.csv; touch /input/new 2>&1; echo x >> /input/data.csv 2>&1; true'], {
        inputDir: input,
      });
      expect(r.stdout, describeResult(r)).toContain('a,b\n1,2\n');
      expect(r.stdout).toContain('Read-only file system');
      expect(r.stdout).not.toMatch(/Permission denied/);
    } finally {
      await rm(input, { recursive: true });
    }
  });

  conformanceIt(target, 'can write only /workspace and /tmp', {}, async () => {
    const r = await sandbox.run([
      'sh', '-c',
      'for p in /workspace/ok /tmp/ok /usr/x /etc/x /x /home/x /var/x; do if touch $p 2>/dev/null; then echo "writable $p"; else echo "denied $p"; fi; done',
    ]);
    expect(r.stdout.trim().split('\n'), describeResult(r)).toEqual([
      'writable /workspace/ok', 'writable /tmp/ok', 'denied /usr/x', 'denied /etc/x', 'denied /x', 'denied /home/x', 'denied /var/x',
    ]);
  });

  conformanceIt(target, 'denies ptrace, mount, unshare, keyctl, bpf, perf_event_open and io_uring', { gvisor: GVISOR_OWN_KERNEL }, async () => {
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
    const r = await sandbox.python(code);
    expect(r.outcome, describeResult(r)).toBe('ok');
    const lines = r.stdout.trim().split('\n');
    expect(lines).toEqual(['ptrace', 'mount', 'unshare', 'keyctl', 'bpf', 'perf_event_open', 'io_uring_setup', 'setns'].map((n) => `${n} denied`));
  });

  conformanceIt(target, 'cannot mount, or make a btrfs subvolume that would escape the disk quota', {}, async () => {
    const r = await sandbox.run(['sh', '-c', 'mount -t tmpfs none /tmp 2>&1; echo "mount=$?"; btrfs subvolume create /workspace/sub 2>&1; echo "subvol=$?"']);
    expect(r.stdout, describeResult(r)).toMatch(/mount=(1|32)/);
    expect(r.stdout).toMatch(/subvol=1/);
  });

  conformanceIt(target, 'cannot make a user namespace', { gvisor: GVISOR_OWN_KERNEL }, async () => {
    const r = await sandbox.run(['sh', '-c', 'unshare -U true 2>&1; echo "unshare=$?"']);
    expect(r.stdout, describeResult(r)).toMatch(/unshare=1/);
  });

  conformanceIt(target, 'has no network but loopback', {}, async () => {
    const r = await sandbox.run(['sh', '-c', 'cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d " "']);
    expect(r.outcome, describeResult(r)).toBe('ok');
    expect(r.stdout.trim().split('\n')).toEqual(['lo']);
  });
});
