import { spawn } from 'node:child_process';
import { SandboxError } from '../../src/errors/index.js';
import type { RunStep, RunStepOptions, StepResult, StepRunner } from '../../src/templates/builder/step-runner.js';

/**
 * TEST ONLY, not the product path: runs a RUN step with bubblewrap as host root, the step's
 * snapshot bound at /, in fresh pid, ipc, uts and network namespaces. It exercises the builder's
 * orchestration (snapshot, run, publish, cache, failure, cancel) with commands the tests wrote
 * themselves; it is not a sandbox for untrusted code (no user namespace, no seccomp, no limits).
 * Product builds get their StepRunner from the engine, which runs each step in a Capsule sandbox.
 */
export class BwrapStepRunner implements StepRunner {
  readonly steps: RunStep[] = [];

  run(step: RunStep, options: RunStepOptions): Promise<StepResult> {
    this.steps.push(step);
    if (step.user !== 'root') return Promise.reject(new SandboxError('UNIMPLEMENTED', 'the test step runner runs steps as root only'));
    const env = Object.entries(step.env).flatMap(([k, v]) => ['--setenv', k, v]);
    const args = ['--bind', step.rootDir, '/', '--proc', '/proc', '--dev', '/dev', '--tmpfs', '/tmp', '--unshare-pid', '--unshare-ipc', '--unshare-uts', '--unshare-net', '--die-with-parent', '--new-session', '--chdir', step.cwd, '--clearenv', ...env, '--', ...step.argv];
    const child = spawn('bwrap', args, { stdio: ['ignore', 'pipe', 'pipe'] });
    const lines = (stream: 'stdout' | 'stderr') => (chunk: Buffer) => {
      for (const line of chunk.toString().split('\n')) if (line !== '') options.onLog(line, stream);
    };
    child.stdout.on('data', lines('stdout'));
    child.stderr.on('data', lines('stderr'));
    const onAbort = () => child.kill('SIGKILL');
    options.signal?.addEventListener('abort', onAbort, { once: true });
    return new Promise((resolve, reject) => {
      child.once('error', reject);
      child.once('close', (code, signal) => {
        options.signal?.removeEventListener('abort', onAbort);
        if (options.signal?.aborted) reject(new SandboxError('ABORTED', 'the step was cancelled'));
        else resolve({ outcome: code === 0 ? 'ok' : 'exit_nonzero', exitCode: code, signal });
      });
    });
  }
}
