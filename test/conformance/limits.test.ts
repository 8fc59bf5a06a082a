import { afterEach, describe, expect } from 'vitest';
import { HOST_TEMPLATE } from '../../src/sandbox-spec/index.js';
import { describeResult, expectNoLeaks } from '../helpers/sandbox.js';
import type { Warning } from '../../src/wire/index.js';
import { backendRunner, CONFORMANCE_TARGETS, conformanceIt, needsConformanceTemplates } from './backends.js';

needsConformanceTemplates();

const MiB = 1024 * 1024;
afterEach(expectNoLeaks);

/** Forks until the first refusal, then says how many it made. */
const FORKER = [
  'import os, time',
  'n = 0',
  'while True:',
  '    try:',
  '        pid = os.fork()',
  '    except OSError as e:',
  '        print("fork failed after", n, e.strerror)',
  '        raise SystemExit(1)',
  '    if pid == 0:',
  '        time.sleep(30)',
  '        os._exit(0)',
  '    n += 1',
].join('\n');

describe.each(CONFORMANCE_TARGETS)('limits end work with a readable, classified error on the $backend backend, $template template', (target) => {
  const sandbox = backendRunner(target);

  conformanceIt(target, 'refuses forks past the pids limit', {}, async () => {
    const r = await sandbox.python(FORKER, { spec: { limits: { pids: 32, wallClockMs: 20_000 } } });
    const made = Number(/fork failed after (\d+) Resource temporarily unavailable/.exec(r.stdout)?.[1]);
    expect(made, describeResult(r)).toBeGreaterThan(10);
    // The forker never gets more children than the limit. Where the agent shares the forker's
    // user (the host template), the agent and the forker count too. On gVisor the bound is
    // RLIMIT_NPROC per user inside its kernel: a template's agent runs as root there, so the
    // template user's processes alone reach the limit (SECURITY-MODEL.md, "What is not guaranteed").
    const perUserOnly = target.backend === 'gvisor' && target.template !== HOST_TEMPLATE;
    if (perUserOnly) expect(made).toBeLessThanOrEqual(32);
    else expect(made).toBeLessThan(32);
  });

  conformanceIt(
    target,
    'classifies the refused fork as a pids limit hit',
    { gvisor: 'gVisor refuses the fork inside its own kernel (RLIMIT_NPROC), where the host has no refusal counter to read; the refusal is enforced (case above) but reported as the program\'s failure' },
    async () => {
      const r = await sandbox.python(FORKER, { spec: { limits: { pids: 32, wallClockMs: 20_000 } } });
      expect(r.outcome, describeResult(r)).toBe('limit_exceeded');
      expect(r.limit?.resource).toBe('pids');
      expect(r.limit?.message).toMatch(/^process limit 32 reached \(\d+ forks? refused\)/);
    },
  );

  conformanceIt(target, 'contains a classic bash fork bomb and leaves nothing behind', {}, async () => {
    const r = await sandbox.run(['bash', '-c', ':(){ :|:& };:; sleep 3'], { spec: { limits: { pids: 64, wallClockMs: 1500 } } });
    expect(r.outcome, describeResult(r)).toBe('limit_exceeded');
    expect(['pids', 'wall_clock']).toContain(r.limit?.resource);
    // afterEach: no process, cgroup or workspace of the bomb is left on the host.
  });

  conformanceIt(target, 'kills a memory hog with a memory error, after a warning', {}, async () => {
    const warnings: Warning[] = [];
    const r = await sandbox.python('import time\nchunks = []\nwhile True:\n    chunks.append(bytearray(8 * 1024 * 1024))\n    time.sleep(0.02)', {
      spec: { limits: { memoryBytes: 128 * MiB } },
      onWarning: (w) => warnings.push(w),
    });
    expect(r.outcome, describeResult(r)).toBe('limit_exceeded');
    expect(r.limit?.resource).toBe('memory');
    expect(r.limit?.limit).toBe(128 * MiB);
    expect(r.limit?.message).toMatch(/^memory limit 128 MiB exceeded \(peak [\d.]+ MiB\); the process was killed by the OOM killer\. Raise limits\.memoryBytes/);
    expect(r.warnings.length).toBe(1);
    expect(warnings[0]?.message).toMatch(/passed 80% of the 128 MiB limit/);
  });

  conformanceIt(target, 'stops a disk filler with a disk error', {}, async () => {
    const r = await sandbox.run(['dd', 'if=/dev/zero', 'of=/workspace/fill', 'bs=1M', 'count=200'], {
      spec: { limits: { diskBytes: 32 * MiB, fileSizeBytes: 512 * MiB } },
    });
    expect(r.outcome, describeResult(r)).toBe('limit_exceeded');
    expect(r.limit?.resource).toBe('disk');
    expect(r.limit?.message).toMatch(/^workspace disk limit 32 MiB reached/);
    expect(r.stderr).toMatch(/Disk quota exceeded/);
  });

  conformanceIt(target, 'stops a huge file with the file-size limit', {}, async () => {
    const r = await sandbox.run(['dd', 'if=/dev/zero', 'of=/workspace/big', 'bs=1M', 'count=50'], {
      spec: { limits: { fileSizeBytes: 5 * MiB } },
    });
    expect(r.outcome, describeResult(r)).toBe('limit_exceeded');
    expect(r.limit?.resource).toBe('file_size');
    expect(r.limit?.message).toMatch(/^file size limit 5 MiB exceeded/);
  });

  conformanceIt(target, 'keeps the first bytes of a stdout flood and flags the truncation', {}, async () => {
    const r = await sandbox.run(['sh', '-c', 'yes capsule | head -c 5000000; echo tail >&2'], { spec: { limits: { stdoutBytes: MiB } } });
    expect(r.outcome, describeResult(r)).toBe('ok');
    expect(r.stdoutTruncated).toBe(true);
    expect(r.stdout.length).toBe(MiB);
    expect(r.stdoutBytes).toBe(5_000_000);
    expect(r.stderrTruncated).toBe(false);
    expect(r.stderr).toBe('tail\n');
  });

  conformanceIt(target, 'ends an infinite loop by wall clock, in real time', {}, async () => {
    const r = await sandbox.python('while True: pass', { spec: { limits: { wallClockMs: 1000 } } });
    expect(r.outcome, describeResult(r)).toBe('limit_exceeded');
    expect(r.limit?.resource).toBe('wall_clock');
    expect(r.limit?.message).toMatch(/^wall-clock limit 1 s exceeded/);
    expect(r.durationMs).toBeGreaterThanOrEqual(1000);
  });

  conformanceIt(target, 'ends a sleeping process by wall clock too (real time, not CPU time)', {}, async () => {
    const r = await sandbox.run(['sleep', '60'], { spec: { limits: { wallClockMs: 500 } } });
    expect(r.outcome, describeResult(r)).toBe('limit_exceeded');
    expect(r.limit?.resource).toBe('wall_clock');
    // Ended by real time: a CPU-time limit could not have fired before 500 ms of CPU were used.
    expect(r.usage.cpuTimeMs).toBeLessThan(500);
  });

  conformanceIt(target, 'kills the whole process tree on timeout', {}, async () => {
    const r = await sandbox.run(['sh', '-c', 'setsid sleep 100 & nohup sleep 100 & sleep 100'], { spec: { limits: { wallClockMs: 500 } } });
    expect(r.limit?.resource, describeResult(r)).toBe('wall_clock');
    // afterEach: no process of the sandbox is left on the host.
  });

  conformanceIt(target, "tells the program's own failure apart from a limit", {}, async () => {
    const r = await sandbox.run(['sh', '-c', 'echo oops >&2; exit 3']);
    expect(r.outcome, describeResult(r)).toBe('exit_nonzero');
    expect(r.exitCode).toBe(3);
    expect(r.limit).toBeUndefined();
    expect(r.stderr).toBe('oops\n');
  });

  conformanceIt(target, 'reports a missing command as an error, not a crash', {}, async () => {
    const r = await sandbox.run(['/nonexistent/tool']);
    expect(r.outcome, describeResult(r)).toBe('error');
    expect(r.error?.code).toBe('EXEC_FAILED');
    expect(r.error?.message).toMatch(/nonexistent/);
  });

  conformanceIt(target, 'bounds /tmp by its own size', {}, async () => {
    const r = await sandbox.run(['dd', 'if=/dev/zero', 'of=/tmp/fill', 'bs=1M', 'count=40'], { spec: { limits: { tmpBytes: 8 * MiB } } });
    expect(r.outcome, describeResult(r)).toBe('exit_nonzero');
    expect(r.stderr).toMatch(/No space left on device/);
  });

  conformanceIt(target, 'bounds /dev/shm by limits.shmBytes and keeps the rest of /dev read-only', {}, async () => {
    // Python's POSIX semaphores and shared memory live in /dev/shm: it works, up to its size.
    const r = await sandbox.run([
      'sh', '-c',
      'python3 -c "import multiprocessing as m; m.Lock(); print(\'sem ok\')"; ' +
        'dd if=/dev/zero of=/dev/shm/fill bs=1M count=40 2>&1; echo "shm $(du -k /dev/shm/fill | cut -f1)"; ' +
        'touch /dev/planted 2>/dev/null && echo "dev writable" || echo "dev read-only"',
    ], { spec: { limits: { shmBytes: 8 * MiB } } });
    expect(r.stdout, describeResult(r)).toContain('sem ok');
    expect(r.stdout).toMatch(/No space left on device/);
    const kib = Number(/shm (\d+)/.exec(r.stdout)?.[1]);
    expect(kib).toBeGreaterThan(4 * 1024);
    expect(kib).toBeLessThanOrEqual(8 * 1024);
    expect(r.stdout).toContain('dev read-only');
  });
});
